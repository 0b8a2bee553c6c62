mod hooks;
mod rules;
mod store;

pub use hooks::{Hooks, MAX_HOOK_TIMEOUT_MS};
pub use rules::*;
pub use store::*;
