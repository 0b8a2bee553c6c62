pub mod job;
pub mod lineage;
pub mod patches;
pub mod retention;
pub mod steps;
mod store;

pub use store::*;
