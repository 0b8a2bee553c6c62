//! The durable agent loop. Each model response and each tool result is persisted through
//! [`AgentContext`] before the loop goes on, so a worker that takes the run over rebuilds
//! the conversation from those rows and never repeats a completed model call.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{Message, ModelResponse, ProviderError, ToolCall, ToolResult, ToolSpec};
use crate::{ContextError, Outcome, RunContext};

/// The model the loop calls. The providers implement it (retries of transient failures
/// included); the loop's tests implement it with a script.
pub trait Model: Send + Sync {
    /// One completed call, with the route that answered it and the ones that failed on
    /// the way. `on_delta` receives assistant text as it streams.
    fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        on_delta: &mut (dyn FnMut(&str) + Send),
        cancel: &CancellationToken,
    ) -> impl Future<Output = Result<Answer, ProviderError>> + Send;
}

/// What answered a model call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub response: ModelResponse,
    /// Transient failures retried on the answering route before this response came.
    pub retries: u32,
    pub route: Route,
    /// Routes tried before it that stayed unavailable through their retries, in order.
    pub failed_over: Vec<FailedRoute>,
}

/// A provider preset and the model asked of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Route {
    pub provider: String,
    pub model: String,
}

/// A route a call failed over from, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedRoute {
    pub provider: String,
    pub model: String,
    pub error: String,
}

/// The tools the loop may dispatch: the workspace tools, or a test's fakes.
pub trait Toolbox: Send + Sync {
    /// What the model is told it may call.
    fn specs(&self) -> Vec<ToolSpec>;
    /// A one-line sanitized description of a call for an approval's action summary.
    fn summarize(&self, call: &ToolCall) -> String;
    /// Runs one call; failures are results with `is_error`, never panics. A file writer
    /// writes only beneath `write_paths` (None: anywhere in the workspace).
    fn call(
        &self,
        call: &ToolCall,
        write_paths: Option<&[String]>,
        cancel: &CancellationToken,
    ) -> impl Future<Output = ToolResult> + Send;
}

/// What the approval policy in force decides for one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolDecision {
    Allow,
    /// The call waits for an operator's approval (with the rest of its response's calls).
    Ask,
    /// Refused without running, with why (for the model and the run's events).
    Deny(String),
}

/// The approval policy in force for a response's tool calls, read when they are answered,
/// so an operator's change applies from the next response on. The default allows every
/// call and writes anywhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolPolicy {
    /// One per call, in order.
    pub decisions: Vec<ToolDecision>,
    /// Where file writers may write, relative to the workspace (None: anywhere).
    pub write_paths: Option<Vec<String>>,
}

impl ToolPolicy {
    fn decision(&self, index: usize) -> &ToolDecision {
        self.decisions.get(index).unwrap_or(&ToolDecision::Allow)
    }
}

/// One completed model call, as the runtime records it.
#[derive(Debug, Clone)]
pub struct ModelCall {
    /// Run-local and 1-based.
    pub index: u32,
    /// How long the call took, retries and failovers included.
    pub duration: Duration,
    pub answer: Answer,
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
    /// Marks model call `index` in flight, fenced, before it starts; recording it clears the
    /// mark. An attempt stopped in between leaves it for the next one to count as abandoned.
    fn start_model_call(&self, index: u32)
    -> impl Future<Output = Result<(), ContextError>> + Send;

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

    /// What the approval policy in force decides for `calls` (a response's pending tool
    /// calls), read afresh each time.
    fn tool_policy(
        &self,
        calls: &[ToolCall],
    ) -> impl Future<Output = Result<ToolPolicy, ContextError>> + Send;

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
    /// Tools whose calls need an approval whatever the approval policy says (the task's
    /// own: a coding agent's writers, an MCP server it marked `require_approval`); the
    /// policy's are read at each response ([`AgentContext::tool_policy`]).
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

/// How an attempt of the loop ended: as any attempt does, or stopped to wait for an
/// approval of the tool calls its model asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoopOutcome {
    Ended(Outcome),
    /// The model asked for tool calls an approval policy gates: the run waits, holding no
    /// lease, until an operator decides. `summary` is the bounded, sanitized description of
    /// the whole bundle the approval covers.
    AwaitingApproval {
        summary: Vec<String>,
        incomplete: bool,
    },
}

impl From<Outcome> for LoopOutcome {
    fn from(outcome: Outcome) -> Self {
        LoopOutcome::Ended(outcome)
    }
}

impl From<ContextError> for LoopOutcome {
    fn from(error: ContextError) -> Self {
        LoopOutcome::Ended(error.into())
    }
}

/// Runs an agent attempt until the model answers without tool calls, a limit stops it, a
/// gated tool call needs an approval, or the attempt is interrupted.
pub async fn run<C: AgentContext, M: Model, T: Toolbox>(
    plan: &AgentPlan,
    model: &M,
    tools: &T,
    ctx: &C,
) -> LoopOutcome {
    let mut attempt = Attempt {
        messages: plan.messages.clone(),
        model_calls: plan.model_calls,
        spent_micros: plan.budget.spent_micros,
        approval: plan.approval,
    };
    attempt
        .drive(plan, model, tools, ctx)
        .await
        .unwrap_or_else(LoopOutcome::from)
}

/// The state one attempt advances: what it adds is persisted before it is used.
struct Attempt {
    messages: Vec<Message>,
    model_calls: u32,
    spent_micros: i64,
    /// Applies to the bundle pending when the attempt started, and to no later one.
    approval: Option<ApprovalDecision>,
}

/// Why the loop stops, before it is saved.
enum Stop {
    Finished,
    Failed(String),
    AwaitingApproval(Vec<String>),
}

impl Attempt {
    async fn drive<C: AgentContext, M: Model, T: Toolbox>(
        &mut self,
        plan: &AgentPlan,
        model: &M,
        tools: &T,
        ctx: &C,
    ) -> Result<LoopOutcome, ContextError> {
        let specs = tools.specs();
        let stop = loop {
            let pending = unanswered(&self.messages);
            if !pending.is_empty() {
                if let Some(stop) = self.answer(plan, &pending, tools, ctx).await? {
                    break stop;
                }
                continue;
            }
            if finished(&self.messages) {
                break Stop::Finished;
            }
            if let Some(refusal) = self.refuse_call(plan) {
                break Stop::Failed(refusal);
            }
            if let Some(failure) = self.call_model(plan, model, &specs, ctx).await? {
                break Stop::Failed(failure);
            }
        };
        ctx.save_conversation(&self.messages).await?;
        Ok(match stop {
            Stop::Finished => Outcome::Completed { exit_code: None }.into(),
            Stop::Failed(error) => Outcome::Failed {
                exit_code: None,
                error,
            }
            .into(),
            Stop::AwaitingApproval(summary) => LoopOutcome::AwaitingApproval {
                summary,
                incomplete: false,
            },
        })
    }

    /// Answers the pending tool calls: dispatches them, refuses them, or stops for an
    /// approval when one is gated and undecided. Approving one gated call of a response
    /// authorizes the whole response; a call the policy denies is refused either way.
    async fn answer<C: AgentContext, T: Toolbox>(
        &mut self,
        plan: &AgentPlan,
        pending: &[ToolCall],
        tools: &T,
        ctx: &C,
    ) -> Result<Option<Stop>, ContextError> {
        let policy = ctx.tool_policy(pending).await?;
        let gated = pending
            .iter()
            .enumerate()
            .any(|(i, call)| match policy.decision(i) {
                ToolDecision::Ask => true,
                ToolDecision::Deny(_) => false,
                ToolDecision::Allow => plan.gated_tools.contains(&call.name),
            });
        let decision = self.approval.take();
        if gated && decision.is_none() {
            let summary = pending.iter().map(|call| tools.summarize(call)).collect();
            return Ok(Some(Stop::AwaitingApproval(summary)));
        }
        for (i, call) in pending.iter().enumerate() {
            if past(plan.deadline) {
                return Ok(Some(Stop::Failed(timed_out())));
            }
            let result = match (policy.decision(i), decision) {
                (ToolDecision::Deny(reason), _) => {
                    ToolResult::blocked("approval_policy", reason.clone())
                }
                (_, Some(ApprovalDecision::Refused)) => refused(call),
                _ => {
                    let write_paths = policy.write_paths.as_deref();
                    self.dispatch(plan, call, write_paths, tools, ctx).await?
                }
            };
            ctx.record_tool_result(call, &result).await?;
            self.messages.push(Message::Tool {
                tool_call_id: call.id.clone(),
                name: call.name.clone(),
                content: result.content,
            });
        }
        Ok(None)
    }

    async fn dispatch<C: AgentContext, T: Toolbox>(
        &self,
        plan: &AgentPlan,
        call: &ToolCall,
        write_paths: Option<&[String]>,
        tools: &T,
        ctx: &C,
    ) -> Result<ToolResult, ContextError> {
        ctx.clear_ahead().await?;
        let cancel = ctx.cancellation().child_token();
        let run = tools.call(call, write_paths, &cancel);
        let result = match plan.deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, run).await.ok(),
            None => Some(run.await),
        };
        cancel.cancel();
        if ctx.cancellation().is_cancelled() {
            return Err(ContextError::Interrupted);
        }
        Ok(result.unwrap_or_else(|| ToolResult {
            content: format!("{} stopped: the run reached its timeout", call.name),
            is_error: true,
            patches: Vec::new(),
            blocked: None,
        }))
    }

    /// Why the next model call may not be made, if it may not.
    fn refuse_call(&self, plan: &AgentPlan) -> Option<String> {
        if past(plan.deadline) {
            return Some(timed_out());
        }
        let made = plan.prior_model_calls + self.model_calls;
        if let Some(max) = plan.max_model_calls
            && made >= max
        {
            return Some(format!(
                "max_model_calls_reached: the task allows {max} model calls and {made} were made"
            ));
        }
        let budget = &plan.budget;
        if budget.limit_micros <= 0 {
            return None;
        }
        let estimate = budget.input_micros_per_token.map_or(0, |price| {
            (estimated_prompt_tokens(&self.messages) as f64 * price) as i64
        });
        (self.spent_micros + estimate >= budget.limit_micros).then(|| {
            format!(
                "budget_exceeded: the task's budget is {} micro-USD, {} are spent, and the next \
                 model call would cost about {estimate} more",
                budget.limit_micros, self.spent_micros
            )
        })
    }

    /// Makes one model call and persists its response; returns why the run fails when the
    /// provider refused.
    async fn call_model<C: AgentContext, M: Model>(
        &mut self,
        plan: &AgentPlan,
        model: &M,
        specs: &[ToolSpec],
        ctx: &C,
    ) -> Result<Option<String>, ContextError> {
        let index = self.model_calls + 1;
        // No model call starts after the lease's local deadline: past it, another worker
        // may be making the same call.
        ctx.clear_ahead().await?;
        ctx.start_model_call(index).await?;
        let started = tokio::time::Instant::now();
        let mut on_delta = |text: &str| ctx.model_delta(index, text);
        let call = model.complete(&self.messages, specs, &mut on_delta, ctx.cancellation());
        let result = match plan.deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, call).await {
                Ok(result) => result,
                Err(_) => return Ok(Some(timed_out())),
            },
            None => call.await,
        };
        let answer = match result {
            Ok(answer) => answer,
            Err(ProviderError::Interrupted) => return Err(ContextError::Interrupted),
            Err(ProviderError::Transient { message, .. }) => {
                return Ok(Some(format!("provider_unavailable: {message}")));
            }
            Err(ProviderError::Fatal { message, .. }) => {
                return Ok(Some(format!("provider_error: {message}")));
            }
        };
        let call = ModelCall {
            index,
            duration: started.elapsed(),
            answer,
        };
        let cost = ctx.record_model_call(&call).await?;
        self.spent_micros += cost.unwrap_or(0);
        self.model_calls = index;
        self.messages.push(call.answer.response.message);
        Ok(None)
    }
}

/// The tool calls of the last assistant message that have no result yet, in order.
fn unanswered(messages: &[Message]) -> Vec<ToolCall> {
    let Some(position) = messages
        .iter()
        .rposition(|m| matches!(m, Message::Assistant { .. }))
    else {
        return Vec::new();
    };
    let Message::Assistant { tool_calls, .. } = &messages[position] else {
        return Vec::new();
    };
    let answered: Vec<&str> = messages[position + 1..]
        .iter()
        .filter_map(|m| match m {
            Message::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    tool_calls
        .iter()
        .filter(|call| !answered.contains(&call.id.as_str()))
        .cloned()
        .collect()
}

/// Whether the model has had the last word: an answer without tool calls.
fn finished(messages: &[Message]) -> bool {
    matches!(messages.last(), Some(Message::Assistant { tool_calls, .. }) if tool_calls.is_empty())
}

/// The model's answer in a conversation it ended: the text of its last message when that
/// message asks for no tool call (None while the loop goes on, or for an empty answer).
pub fn final_answer(messages: &[Message]) -> Option<&str> {
    match messages.last() {
        Some(Message::Assistant {
            content: Some(text),
            tool_calls,
            ..
        }) if tool_calls.is_empty() && !text.is_empty() => Some(text),
        _ => None,
    }
}

/// What the model reads for a call an operator rejected.
fn refused(call: &ToolCall) -> ToolResult {
    let content = format!(
        "The operator rejected this {} call; it was not run. Continue without it.",
        call.name
    );
    ToolResult::blocked("approval_rejected", content)
}

/// An estimate of the prompt's tokens, at about four bytes of text per token (English text
/// and code); the provider's count is known only once the call is made.
fn estimated_prompt_tokens(messages: &[Message]) -> u64 {
    let bytes: usize = messages
        .iter()
        .map(|message| match message {
            Message::System { content } | Message::User { content } => content.len(),
            Message::Assistant {
                content,
                tool_calls,
                ..
            } => {
                content.as_ref().map_or(0, String::len)
                    + tool_calls.iter().map(|c| c.arguments.len()).sum::<usize>()
            }
            Message::Tool { content, .. } => content.len(),
        })
        .sum();
    (bytes / 4) as u64
}

fn past(deadline: Option<tokio::time::Instant>) -> bool {
    deadline.is_some_and(|d| tokio::time::Instant::now() >= d)
}

fn timed_out() -> String {
    "timeout: the run reached its timeout_ms".to_string()
}

#[cfg(test)]
mod tests;
