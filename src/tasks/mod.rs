mod rules;
mod store;

pub use rules::*;
pub use store::*;
