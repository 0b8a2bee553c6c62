mod hooks;
mod mcp;
mod rules;
mod store;
mod writer;

pub use hooks::{Hooks, MAX_HOOK_TIMEOUT_MS};
pub use mcp::StdioCommands;
pub(crate) use mcp::{
    check_host as check_mcp_server_host, check_name as check_mcp_server_name, starts_a_process,
};
pub use rules::*;
pub use store::*;
pub(crate) use writer::resolve_secret;
