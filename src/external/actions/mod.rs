pub mod job;
mod rules;
pub mod send;
mod store;

pub use rules::*;
pub use store::*;
