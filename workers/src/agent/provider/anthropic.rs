//! Anthropic messages, streaming: the request body (the system prompt top-level, tool
//! calls as `tool_use` blocks, tool results as a user message of `tool_result` blocks),
//! and the response assembled from its events (`message_start`, `content_block_start`,
//! `content_block_delta`, `message_delta`, `message_stop`, `error`).

use std::collections::BTreeMap;

use eventsource_stream::Event;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Assemble, ProviderConfig, fatal, stream_failure};
use crate::agent::{Message, ModelResponse, ProviderError, ToolCall, ToolSpec, Usage};

pub(super) const VERSION: &str = "2023-06-01";
/// The answer's limit when the preset sets none: the API requires one.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The thinking budget (tokens) of each reasoning effort; the API takes at least 1024.
fn thinking_budget(effort: &str) -> u32 {
    match effort {
        "minimal" => 1024,
        "low" => 2048,
        "medium" => 8192,
        _ => 24576,
    }
}

/// The thinking budget of this call: the task's effort's, unless the turn whose tool calls
/// are being answered carries no thinking blocks (another provider's, or one made while
/// thinking was off), which the API refuses while thinking is on.
fn thinking(config: &ProviderConfig, messages: &[Message]) -> Option<u32> {
    let effort = config.reasoning_effort.as_deref()?;
    let answering_unthought_calls = matches!(
        messages.iter().rev().find(|m| matches!(m, Message::Assistant { .. })),
        Some(Message::Assistant { tool_calls, thinking, .. })
            if !tool_calls.is_empty() && thinking.is_empty()
    );
    (!answering_unthought_calls).then(|| thinking_budget(effort))
}

pub(super) fn request(config: &ProviderConfig, messages: &[Message], tools: &[ToolSpec]) -> Value {
    let budget = thinking(config, messages);
    let mut system = Vec::new();
    // Anthropic alternates user and assistant turns: consecutive messages of one role
    // (the results of parallel tool calls above all) become one turn of several blocks.
    let mut turns: Vec<(&str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, blocks) = match message {
            Message::System { content } => {
                system.push(content.as_str());
                continue;
            }
            Message::User { content } => ("user", vec![json!({"type": "text", "text": content})]),
            Message::Assistant {
                content,
                tool_calls,
                thinking,
            } => {
                let thinking = if budget.is_some() { &thinking[..] } else { &[] };
                let blocks = assistant_blocks(thinking, content.as_deref(), tool_calls);
                ("assistant", blocks)
            }
            Message::Tool {
                tool_call_id,
                content,
                ..
            } => (
                "user",
                vec![
                    json!({"type": "tool_result", "tool_use_id": tool_call_id, "content": content}),
                ],
            ),
        };
        match turns.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ if blocks.is_empty() => {}
            _ => turns.push((role, blocks)),
        }
    }
    // The answer keeps its own room on top of the thinking (the budget counts within
    // `max_tokens`, and must stay below it).
    let answer = config.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let mut body = json!({
        "model": config.model,
        "max_tokens": answer + budget.unwrap_or(0),
        "messages": turns
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect::<Vec<_>>(),
        "stream": true,
    });
    if !system.is_empty() {
        body["system"] = system.join("\n\n").into();
    }
    if let Some(budget) = budget {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
    }
    if !tools.is_empty() {
        body["tools"] = tools
            .iter()
            .map(|tool| {
                json!({"name": tool.name, "description": tool.description,
                    "input_schema": tool.parameters})
            })
            .collect();
    }
    body
}

/// The turn's thinking blocks as they came, text (when there is some: empty text blocks
/// are refused) then one `tool_use` per call. `input` must be an object: arguments that are
/// not one (the model wrote invalid JSON, and the tool answered with an error) go as `{}`.
fn assistant_blocks(
    thinking: &[Value],
    content: Option<&str>,
    tool_calls: &[ToolCall],
) -> Vec<Value> {
    let text = content
        .filter(|text| !text.is_empty())
        .map(|text| json!({"type": "text", "text": text}));
    let thinking = thinking.iter().cloned();
    let calls = tool_calls.iter().map(|call| {
        let input = serde_json::from_str::<Value>(&call.arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input})
    });
    thinking.chain(text).chain(calls).collect()
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent {
    MessageStart {
        message: StartMessage,
    },
    ContentBlockStart {
        index: usize,
        content_block: Block,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    MessageDelta {
        #[serde(default)]
        delta: MessageDelta,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Error {
        error: Value,
    },
    /// `ping`, `content_block_stop` and whatever is added later.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct StartMessage {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        data: String,
    },
    /// Blocks the conversation does not keep.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    SignatureDelta {
        signature: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct MessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

/// Cumulative counts; `message_delta` may repeat any of them.
#[derive(Deserialize)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

enum Part {
    Text(String),
    Thinking {
        thinking: String,
        signature: String,
    },
    RedactedThinking(String),
    /// The `input` of `content_block_start`, replaced by the streamed JSON when any comes.
    Tool {
        id: String,
        name: String,
        input: Value,
        json: String,
    },
}

#[derive(Default)]
pub(super) struct Assembler {
    /// By the events' `index`.
    parts: BTreeMap<usize, Part>,
    model: Option<String>,
    stop_reason: Option<String>,
    input: u64,
    output: u64,
    cache_read: u64,
    cache_creation: u64,
}

impl Assembler {
    fn usage(&mut self, usage: WireUsage) {
        self.input = usage.input_tokens.unwrap_or(self.input);
        self.output = usage.output_tokens.unwrap_or(self.output);
        self.cache_read = usage.cache_read_input_tokens.unwrap_or(self.cache_read);
        self.cache_creation = usage
            .cache_creation_input_tokens
            .unwrap_or(self.cache_creation);
    }

    fn delta(&mut self, index: usize, delta: BlockDelta, on_delta: &mut (dyn FnMut(&str) + Send)) {
        match (self.parts.get_mut(&index), delta) {
            (Some(Part::Text(text)), BlockDelta::TextDelta { text: piece }) => {
                on_delta(&piece);
                text.push_str(&piece);
            }
            (Some(Part::Tool { json, .. }), BlockDelta::InputJsonDelta { partial_json }) => {
                json.push_str(&partial_json);
            }
            (
                Some(Part::Thinking { thinking, .. }),
                BlockDelta::ThinkingDelta { thinking: piece },
            ) => {
                thinking.push_str(&piece);
            }
            (
                Some(Part::Thinking { signature, .. }),
                BlockDelta::SignatureDelta { signature: piece },
            ) => {
                signature.push_str(&piece);
            }
            _ => {}
        }
    }
}

impl Assemble for Assembler {
    fn event(
        &mut self,
        event: &Event,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<bool, ProviderError> {
        if event.data.trim().is_empty() {
            return Ok(false);
        }
        let parsed: StreamEvent = serde_json::from_str(&event.data)
            .map_err(|e| fatal(format!("the provider sent an unreadable event: {e}")))?;
        match parsed {
            StreamEvent::MessageStart { message } => {
                self.model = message.model;
                if let Some(usage) = message.usage {
                    self.usage(usage);
                }
            }
            StreamEvent::ContentBlockStart {
                index,
                content_block,
            } => {
                let part = match content_block {
                    Block::Text { text } => Part::Text(text),
                    Block::ToolUse { id, name, input } => Part::Tool {
                        id,
                        name,
                        input,
                        json: String::new(),
                    },
                    Block::Thinking {
                        thinking,
                        signature,
                    } => Part::Thinking {
                        thinking,
                        signature,
                    },
                    Block::RedactedThinking { data } => Part::RedactedThinking(data),
                    Block::Other => return Ok(false),
                };
                self.parts.insert(index, part);
            }
            StreamEvent::ContentBlockDelta { index, delta } => self.delta(index, delta, on_delta),
            StreamEvent::MessageDelta { delta, usage } => {
                self.stop_reason = delta.stop_reason.or(self.stop_reason.take());
                if let Some(usage) = usage {
                    self.usage(usage);
                }
            }
            StreamEvent::MessageStop => return Ok(true),
            StreamEvent::Error { error } => return Err(stream_failure(&error)),
            StreamEvent::Other => {}
        }
        Ok(false)
    }

    /// Without `message_stop` the message may be cut anywhere.
    fn complete_at_end(&self) -> bool {
        false
    }

    fn finish(self: Box<Self>, model: &str) -> ModelResponse {
        let this = *self;
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        let mut thinking = Vec::new();
        for part in this.parts.into_values() {
            match part {
                Part::Text(piece) => text.push_str(&piece),
                Part::Thinking {
                    thinking: text,
                    signature,
                } => thinking
                    .push(json!({"type": "thinking", "thinking": text, "signature": signature})),
                Part::RedactedThinking(data) => {
                    thinking.push(json!({"type": "redacted_thinking", "data": data}))
                }
                Part::Tool {
                    id,
                    name,
                    input,
                    json,
                } => {
                    let arguments = match (json.is_empty(), input) {
                        (false, _) => json,
                        (true, Value::Null) => "{}".to_string(),
                        (true, input) => input.to_string(),
                    };
                    tool_calls.push(ToolCall {
                        id,
                        name,
                        arguments,
                    });
                }
            }
        }
        ModelResponse {
            message: Message::Assistant {
                content: (!text.is_empty()).then_some(text),
                tool_calls,
                thinking,
            },
            usage: Usage {
                prompt_tokens: this.input + this.cache_read + this.cache_creation,
                completion_tokens: this.output,
                cached_tokens: this.cache_read,
            },
            model: this.model.unwrap_or_else(|| model.to_string()),
            finish_reason: this.stop_reason.map(|reason| normalized(&reason)),
        }
    }
}

/// Anthropic's stop reasons in OpenAI's words.
fn normalized(stop_reason: &str) -> String {
    match stop_reason {
        "end_turn" | "stop_sequence" => "stop",
        "tool_use" => "tool_calls",
        "max_tokens" => "length",
        other => other,
    }
    .to_string()
}
