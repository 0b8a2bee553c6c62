mod hooks;
mod mcp;
mod rules;
mod store;
mod writer;

pub use hooks::{Hooks, MAX_HOOK_TIMEOUT_MS};
pub(crate) use mcp::check_secrets as check_mcp_secrets;
pub use rules::*;
pub use store::*;
pub(crate) use writer::check_secret;
