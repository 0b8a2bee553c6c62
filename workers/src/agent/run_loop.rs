//! The durable agent loop. Each model response and each tool result is persisted through
//! [`AgentContext`] before the loop goes on, so a worker that takes the run over rebuilds
//! the conversation from those rows and never repeats a completed model call.

use std::future::Future;
use std::time::Duration;

use super::{Message, ModelResponse, ToolCall, ToolResult};
use crate::{ContextError, RunContext};

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
