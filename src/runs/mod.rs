pub mod gates;
pub mod job;
pub mod lineage;
pub mod patches;
pub mod retention;
pub mod steps;
mod store;

pub use gates::resolve_gate;
pub use store::*;
