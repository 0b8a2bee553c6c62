#[macro_use]
mod records;
mod admission;
pub(crate) mod client;
pub(crate) mod gates;
pub(crate) mod job;
pub(crate) mod lineage;
pub mod patches;
mod projection;
pub(crate) mod retention;
pub mod steps;
mod store;

pub use admission::*;
pub use gates::resolve_gate;
pub use projection::state;
pub use store::*;
