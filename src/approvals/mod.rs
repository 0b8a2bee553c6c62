mod policy;
mod store;

pub use policy::*;
pub use store::*;
