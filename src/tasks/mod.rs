//! Tasks: durable execution intent. This root owns a task's validation (`rules`), its
//! row (`store`), its hooks, its MCP servers as written (`mcp`) and who wrote it
//! (`writer`: which secrets and hosts it may name). Runs of a task live in [`crate::runs`].
//! Elsewhere: the routes in `api/tasks.rs`; the contract in `api-types/src/task.rs`.

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
pub(crate) use rules::{
    AgentLoop, NESTED_WORKSPACE, TaskExecution, WorkspaceMode, check_branch, one_line_title,
    parse_budget,
};
pub use rules::{NewTask, RunTimeouts, TaskDraft, TaskStatus, WorkspaceRoots};
pub use store::{LIST_MAX_ROWS, delete, get, insert, list};
pub(crate) use store::{
    TaskRecord, TaskRecordExt, chat_routes, get_locked, hooks, in_place_nesting, lock, set_prompt,
    written_by,
};
pub(crate) use writer::resolve_secret;
