//! The agent loop's side of a run: the attempt of an `agent_loop` run (`job`), the MCP
//! servers its worker reaches (`mcp`), what it reads from the run's rows (`store`), the
//! model-call ledger (`model_calls`), prices and usage. [`crate::runs`]' `run` job hands
//! it the attempt through its executor seam (`runs::job::RunExecutor`, implemented by
//! [`AgentJobs`]). Elsewhere: the loop itself, its tools and the model clients in
//! `workers/src/agent/`; usage's routes in `api/usage.rs`.

pub(crate) mod activity;
pub(crate) mod context;
mod job;
mod mcp;
pub(crate) mod model_calls;
pub(crate) mod prices;
mod store;
pub(crate) mod transcript;
pub(crate) mod usage;

pub(crate) use job::AgentJobs;
