//! OpenAI chat completions, streaming: the request body, and the response assembled from
//! its `chat.completion.chunk`s (text deltas, tool calls by `index` in pieces, usage in the
//! last chunk thanks to `stream_options.include_usage`, then `data: [DONE]`).

use eventsource_stream::Event;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Assemble, Collected, ProviderConfig, fatal, stream_failure};
use crate::agent::{Message, ModelResponse, ProviderError, ToolCall, ToolSpec, Usage};

pub(super) fn request(config: &ProviderConfig, messages: &[Message], tools: &[ToolSpec]) -> Value {
    let mut body = json!({
        "model": config.model,
        "messages": messages.iter().map(message).collect::<Vec<_>>(),
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !tools.is_empty() {
        body["tools"] = tools
            .iter()
            .map(|tool| {
                json!({"type": "function", "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                }})
            })
            .collect();
    }
    if let Some(max_tokens) = config.max_tokens {
        body["max_tokens"] = max_tokens.into();
    }
    if let Some(effort) = &config.reasoning_effort {
        body["reasoning_effort"] = effort.as_str().into();
    }
    body
}

fn message(message: &Message) -> Value {
    match message {
        Message::System { content } => json!({"role": "system", "content": content}),
        Message::User { content } => json!({"role": "user", "content": content}),
        Message::Assistant {
            content,
            tool_calls,
            ..
        } => {
            let mut value = json!({"role": "assistant", "content": content});
            if !tool_calls.is_empty() {
                value["tool_calls"] = tool_calls
                    .iter()
                    .map(|call| {
                        json!({"id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments}})
                    })
                    .collect();
            }
            value
        }
        Message::Tool {
            tool_call_id,
            content,
            ..
        } => json!({"role": "tool", "tool_call_id": tool_call_id, "content": content}),
    }
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    /// Some compatible servers report a failure as a chunk.
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    index: usize,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// The tool calls are kept by the chunks' `index`.
#[derive(Default)]
pub(super) struct Assembler(Collected);

impl Assembler {
    fn chunk(&mut self, chunk: Chunk, on_delta: &mut (dyn FnMut(&str) + Send)) {
        let this = &mut self.0;
        this.answered_by(chunk.model);
        if let Some(usage) = chunk.usage {
            this.usage = Usage {
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                cached_tokens: usage
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0),
            };
        }
        // One choice is asked for (no `n`).
        let Some(choice) = chunk.choices.into_iter().next() else {
            return;
        };
        if let Some(reason) = choice.finish_reason {
            this.finish_reason = Some(reason);
        }
        let Some(delta) = choice.delta else { return };
        this.text(delta.content.as_deref().unwrap_or_default(), on_delta);
        for piece in delta.tool_calls {
            let call = this.calls.entry(piece.index).or_insert_with(|| ToolCall {
                id: String::new(),
                name: String::new(),
                arguments: String::new(),
            });
            // The id comes once (some servers repeat it); name and arguments in pieces.
            if let Some(id) = piece.id.filter(|id| !id.is_empty()) {
                call.id = id;
            }
            if let Some(function) = piece.function {
                call.name.push_str(function.name.as_deref().unwrap_or(""));
                call.arguments
                    .push_str(function.arguments.as_deref().unwrap_or(""));
            }
        }
    }
}

impl Assemble for Assembler {
    fn event(
        &mut self,
        event: &Event,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<bool, ProviderError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| fatal(format!("the provider sent an unreadable chunk: {e}")))?;
        if let Some(error) = &chunk.error {
            return Err(stream_failure(error));
        }
        self.chunk(chunk, on_delta);
        Ok(false)
    }

    /// A server that closes without `[DONE]` after the finish reason has said everything.
    fn complete_at_end(&self) -> bool {
        self.0.finish_reason.is_some()
    }

    fn finish(self: Box<Self>, model: &str) -> ModelResponse {
        self.0.response(model)
    }
}
