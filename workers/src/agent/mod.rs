//! The agent loop's vocabulary: the provider-neutral conversation a run persists, what a
//! model call returns, and what a tool call produces. The providers ([`provider`]) translate
//! it to and from OpenAI chat completions and Anthropic messages; the tools ([`tools`]) act
//! on the run's workspace; the loop ([`run_loop`]) drives both and persists every model
//! response and tool result through [`run_loop::AgentContext`] before the next call starts.
//!
//! Everything here that a run persists is `Serialize`/`Deserialize` with a stable shape:
//! a worker that takes a run over rebuilds the conversation from these rows.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod instructions;
pub mod mcp;
pub mod provider;
pub mod run_loop;
pub mod tools;

/// One message of a conversation, in the order the model sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// Anthropic's thinking blocks of this turn (`thinking` with its `signature`,
        /// `redacted_thinking`), as the provider sent them: sent back with the turn while
        /// thinking is on, which the API requires of a turn whose tool calls are being
        /// answered. The other APIs ignore them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        thinking: Vec<serde_json::Value>,
    },
    /// The result of one tool call, answering the assistant message that asked for it.
    Tool {
        tool_call_id: String,
        name: String,
        content: String,
    },
}

/// A tool call the model asked for. `arguments` is the JSON text the model wrote, kept as
/// it came (it may not even parse: the tool then answers with an error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// Token counts of one model call, as the provider reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Prompt tokens served from the provider's cache (a subset of `prompt_tokens`).
    pub cached_tokens: u64,
}

/// What one completed model call returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// Always [`Message::Assistant`].
    pub message: Message,
    pub usage: Usage,
    /// The model the provider says answered (it may differ from the one asked for).
    pub model: String,
    /// `stop`, `tool_calls`, `length`, … as the provider said it (normalized to OpenAI's words).
    pub finish_reason: Option<String>,
}

impl ModelResponse {
    /// The tool calls the response asks for, in order.
    pub fn tool_calls(&self) -> &[ToolCall] {
        match &self.message {
            Message::Assistant { tool_calls, .. } => tool_calls,
            _ => &[],
        }
    }
}

/// A tool as the model is told about it: a JSON Schema for its arguments.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// Worth trying again: 429, 5xx, a reset connection, a timeout. `retry_after` is the
    /// provider's `Retry-After`, when it sent one.
    #[error("transient provider failure: {message}")]
    Transient {
        message: String,
        retry_after: Option<Duration>,
    },
    /// The request's own fault (a 4xx other than 429) or an answer that cannot be read:
    /// the run fails with this message. Never contains the API key.
    #[error("provider refused the request: {message}")]
    Fatal {
        status: Option<u16>,
        message: String,
    },
    /// The attempt was cancelled while the call was in flight.
    #[error("the model call was interrupted")]
    Interrupted,
}

/// What a tool call produced: the text the model reads, and for file-writing tools the
/// change it made, which the runtime records as a patch artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// Bounded (see the tools' output limit), with a truncation marker when cut.
    pub content: String,
    pub is_error: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<Patch>,
    /// Set when a policy refused the call rather than the tool failing: which policy
    /// (`sandbox_read_only`, `tool_not_allowed`, `mcp_server_blocked`, `approval_rejected`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<String>,
}

impl ToolResult {
    /// A call `policy` refused, answered with `content`.
    pub fn blocked(policy: &str, content: String) -> ToolResult {
        ToolResult {
            content,
            is_error: true,
            patches: Vec::new(),
            blocked: Some(policy.to_string()),
        }
    }
}

/// One file's change by a tool: the content before and after (None: the file did not exist
/// / was removed). `path` is relative to the run's workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Patch {
    pub path: String,
    pub before: Option<String>,
    pub after: Option<String>,
    /// Not written: the tool was called with `propose: true`, and an operator applies it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub proposed: bool,
}
