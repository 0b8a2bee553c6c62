//! The durable agent loop. Each model response and each tool result is persisted through
//! [`AgentContext`] before the loop goes on, so a worker that takes the run over rebuilds
//! the conversation from those rows and never repeats a completed model call.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Message, ModelResponse, ProviderError, ToolCall, ToolResult, ToolSpec};
use crate::{ContextError, RunContext};

/// The model the loop calls. The providers implement it (retries of transient failures
/// included); the loop's tests implement it with a script.
pub trait Model: Send + Sync {
    /// One completed call and the number of transient failures retried on the way.
    /// `on_delta` receives assistant text as it streams.
    fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        on_delta: &mut (dyn FnMut(&str) + Send),
        cancel: &CancellationToken,
    ) -> impl Future<Output = Result<(ModelResponse, u32), ProviderError>> + Send;
}

/// The tools the loop may dispatch: the workspace tools, or a test's fakes.
pub trait Toolbox: Send + Sync {
    /// What the model is told it may call.
    fn specs(&self) -> Vec<ToolSpec>;
    /// A one-line sanitized description of a call for an approval's action summary.
    fn summarize(&self, call: &ToolCall) -> String;
    /// Runs one call; failures are results with `is_error`, never panics.
    fn call(
        &self,
        call: &ToolCall,
        cancel: &CancellationToken,
    ) -> impl Future<Output = ToolResult> + Send;
}

/// One completed model call, as the runtime records it.
#[derive(Debug, Clone)]
pub struct ModelCall {
    /// Run-local and 1-based.
    pub index: u32,
    pub response: ModelResponse,
    /// How long the call took, retries included.
    pub duration: Duration,
    /// Transient failures retried before this response came.
    pub retries: u32,
}

/// What an operator decided about the pending tool calls of the conversation's last
/// assistant message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalDecision {
    /// Dispatch exactly those calls, without calling the model again.
    Approved,
    /// Rejected with `continue`: each call gets a refusal as its result and the loop goes on.
    Refused,
}

/// What the loop asks of the runtime beyond [`RunContext`]. Every call is fenced by the
/// worker's lease.
pub trait AgentContext: RunContext {
    /// Persists a completed model call in one fenced transaction: a `model_call` step whose
    /// output holds the response, its usage row, the run's counters and a
    /// `model.call.completed` event. Returns the call's cost in micro-USD (None: the price
    /// table does not know the model).
    fn record_model_call(
        &self,
        call: &ModelCall,
    ) -> impl Future<Output = Result<Option<i64>, ContextError>> + Send;

    /// Persists one tool call's result in one fenced transaction: a `tool_call` step and a
    /// patch artifact per changed file.
    fn record_tool_result(
        &self,
        call: &ToolCall,
        result: &ToolResult,
    ) -> impl Future<Output = Result<(), ContextError>> + Send;

    /// The whole conversation when the loop stops (finished, failed or waiting for an
    /// approval); written as the run's `agent_conversation` artifact with its end.
    fn save_conversation(
        &self,
        messages: &[Message],
    ) -> impl Future<Output = Result<(), ContextError>> + Send;

    /// Assistant text as a call streams it. Best effort and not persisted: delivered live
    /// to the run's SSE clients as `model.delta`.
    fn model_delta(&self, index: u32, text: &str);
}

/// Where an attempt of an agent run starts and what bounds it; the runtime rebuilds it from
/// the run's rows at every attempt.
#[derive(Debug, Clone)]
pub struct AgentPlan {
    /// The conversation so far: the run's base (the task's prompts, or what it continues)
    /// and every model response and tool result this run persisted.
    pub messages: Vec<Message>,
    /// Completed model calls of this run (persisted), and of the runs before it in its
    /// resume chain: `max_model_calls` counts both.
    pub model_calls: u32,
    pub prior_model_calls: u32,
    pub max_model_calls: Option<u32>,
    /// Tools whose calls need an approval (`KEEL_APPROVAL_POLICIES`).
    pub gated_tools: Vec<String>,
    /// The decision on the pending calls of the last assistant message, when one was made.
    pub approval: Option<ApprovalDecision>,
    pub budget: Budget,
    /// When the attempt must stop (the task's `timeout_ms`).
    pub deadline: Option<tokio::time::Instant>,
}

/// The task's spending ceiling across the resume chain.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Budget {
    /// In micro-USD; 0: no ceiling.
    pub limit_micros: i64,
    /// Spent by the runs before this one and by this one so far.
    pub spent_micros: i64,
    /// The model's input price, for the lower bound of a call's cost that decides whether
    /// the call may be made; None when the price table does not know the model.
    pub input_micros_per_token: Option<f64>,
}
