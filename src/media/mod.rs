pub(crate) mod job;
mod rules;
mod store;

pub use rules::*;
pub use store::*;
