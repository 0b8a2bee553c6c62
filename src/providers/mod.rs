pub(crate) mod chat;
mod presets;
pub mod secrets;
mod store;

pub use presets::*;
pub use store::*;
