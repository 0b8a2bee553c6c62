pub(crate) mod job;
mod rules;
pub(crate) mod send;
mod store;

pub(crate) use rules::*;
pub use store::*;
