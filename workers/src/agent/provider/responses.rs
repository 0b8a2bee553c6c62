//! OpenAI Responses, streaming: the request body (system prompts as `instructions`, the
//! conversation as input items: messages, `function_call`s and their
//! `function_call_output`s; `store: false`, so nothing is kept on the provider's side and
//! every call carries the whole conversation, as the other protocols do), and the response
//! assembled from its typed events: `response.output_text.delta` for text,
//! `response.output_item.done` for each finished function call, `response.completed` (or
//! `response.incomplete`) with the usage, `response.failed` and `error` for failures.

use eventsource_stream::Event;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Assemble, Collected, ProviderConfig, fatal, stream_failure};
use crate::agent::{Message, ModelResponse, ProviderError, ToolCall, ToolSpec, Usage};

pub(super) fn request(config: &ProviderConfig, messages: &[Message], tools: &[ToolSpec]) -> Value {
    let instructions: Vec<&str> = messages
        .iter()
        .filter_map(|message| match message {
            Message::System { content } => Some(content.as_str()),
            _ => None,
        })
        .collect();
    let mut body = json!({
        "model": config.model,
        "input": messages.iter().flat_map(items).collect::<Vec<_>>(),
        "stream": true,
        "store": false,
    });
    if !instructions.is_empty() {
        body["instructions"] = instructions.join("\n\n").into();
    }
    if !tools.is_empty() {
        body["tools"] = tools
            .iter()
            .map(|tool| {
                json!({"type": "function", "name": tool.name, "description": tool.description,
                       "parameters": tool.parameters, "strict": false})
            })
            .collect();
    }
    if let Some(max_tokens) = config.max_tokens {
        body["max_output_tokens"] = max_tokens.into();
    }
    if let Some(effort) = &config.reasoning_effort {
        body["reasoning"] = json!({"effort": effort});
    }
    body
}

/// The input items of one message (an assistant turn with tool calls is several).
fn items(message: &Message) -> Vec<Value> {
    match message {
        Message::System { .. } => Vec::new(),
        Message::User { content } => vec![json!({"role": "user", "content": content})],
        Message::Assistant {
            content,
            tool_calls,
            ..
        } => content
            .iter()
            .map(|text| json!({"role": "assistant", "content": text}))
            .chain(tool_calls.iter().map(|call| {
                json!({"type": "function_call", "call_id": call.id, "name": call.name,
                       "arguments": call.arguments})
            }))
            .collect(),
        Message::Tool {
            tool_call_id,
            content,
            ..
        } => vec![
            json!({"type": "function_call_output", "call_id": tool_call_id,
                         "output": content}),
        ],
    }
}

/// The events this reader uses; the others (`response.created`, content parts, argument
/// deltas, …) carry nothing the finished items do not.
#[derive(Deserialize)]
#[serde(tag = "type")]
enum Streamed {
    #[serde(rename = "response.output_text.delta")]
    TextDelta { delta: String },
    #[serde(rename = "response.output_item.done")]
    ItemDone { output_index: usize, item: Item },
    #[serde(rename = "response.completed")]
    Completed { response: Summary },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: Summary },
    #[serde(rename = "response.failed")]
    Failed { response: Summary },
    #[serde(rename = "error")]
    Error {
        #[serde(default)]
        code: Option<String>,
        #[serde(default)]
        message: Option<String>,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum Item {
    #[serde(rename = "function_call")]
    FunctionCall {
        call_id: String,
        name: String,
        #[serde(default)]
        arguments: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct Summary {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    incomplete_details: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// The tool calls are kept by the items' `output_index`.
#[derive(Default)]
pub(super) struct Assembler(Collected);

impl Assembler {
    /// The end of the response: its usage and model, and why it stopped in the words of
    /// OpenAI's chat completions (`tool_calls`, `stop`, `length`, …).
    fn end(&mut self, summary: Summary, incomplete: bool) {
        let this = &mut self.0;
        this.answered_by(summary.model);
        if let Some(usage) = summary.usage {
            this.usage = Usage {
                prompt_tokens: usage.input_tokens,
                completion_tokens: usage.output_tokens,
                cached_tokens: usage
                    .input_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0),
            };
        }
        let reason = match summary.incomplete_details {
            Some(details) if incomplete => match details.get("reason").and_then(Value::as_str) {
                Some("max_output_tokens") => "length".to_string(),
                Some(other) => other.to_string(),
                None => "incomplete".to_string(),
            },
            _ if !this.calls.is_empty() => "tool_calls".to_string(),
            _ => "stop".to_string(),
        };
        this.finish_reason = Some(reason);
    }
}

impl Assemble for Assembler {
    fn event(
        &mut self,
        event: &Event,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<bool, ProviderError> {
        let data = event.data.trim();
        if data.is_empty() || data == "[DONE]" {
            return Ok(false);
        }
        let streamed: Streamed = serde_json::from_str(data)
            .map_err(|e| fatal(format!("the provider sent an unreadable event: {e}")))?;
        match streamed {
            Streamed::TextDelta { delta } => self.0.text(&delta, on_delta),
            Streamed::ItemDone {
                output_index,
                item:
                    Item::FunctionCall {
                        call_id,
                        name,
                        arguments,
                    },
            } => {
                let call = ToolCall {
                    id: call_id,
                    name,
                    arguments,
                };
                self.0.calls.insert(output_index, call);
            }
            Streamed::ItemDone { .. } | Streamed::Other => {}
            Streamed::Completed { response } => {
                self.end(response, false);
                return Ok(true);
            }
            Streamed::Incomplete { response } => {
                self.end(response, true);
                return Ok(true);
            }
            Streamed::Failed { response } => {
                let error = response.error.unwrap_or_else(|| json!({}));
                return Err(stream_failure(&failure(&error)));
            }
            Streamed::Error { code, message } => {
                let error = json!({"code": code, "message": message});
                return Err(stream_failure(&failure(&error)));
            }
        }
        Ok(false)
    }

    /// The response's end is its `response.completed` event; a stream closed before it
    /// holds no whole answer.
    fn complete_at_end(&self) -> bool {
        false
    }

    fn finish(self: Box<Self>, model: &str) -> ModelResponse {
        self.0.response(model)
    }
}

/// A Responses error (`{"code", "message"}`) in the shape [`stream_failure`] reads:
/// `server_error` (and a rate limit met mid-stream) is worth trying again.
fn failure(error: &Value) -> Value {
    let code = error.get("code").and_then(Value::as_str).unwrap_or("error");
    let kind = match code {
        "server_error" | "rate_limit_exceeded" => "server_error",
        other => other,
    };
    json!({"type": kind, "message": error.get("message").cloned().unwrap_or(Value::Null)})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(assembler: &mut Assembler, data: Value) -> Result<bool, ProviderError> {
        let event = Event {
            event: data["type"].as_str().unwrap_or_default().to_string(),
            data: data.to_string(),
            id: String::new(),
            retry: None,
        };
        assembler.event(&event, &mut |_: &str| {})
    }

    #[test]
    fn a_failed_response_is_transient_on_a_server_error_and_fatal_otherwise() {
        let failed = |code: &str| {
            json!({"type": "response.failed", "response": {"status": "failed",
                "error": {"code": code, "message": "it broke"}}})
        };
        let transient = feed(&mut Assembler::default(), failed("server_error"));
        assert!(
            matches!(&transient, Err(ProviderError::Transient { message, .. }) if message.contains("it broke")),
            "{transient:?}"
        );
        let refused = feed(&mut Assembler::default(), failed("invalid_prompt"));
        assert!(
            matches!(refused, Err(ProviderError::Fatal { .. })),
            "{refused:?}"
        );
        let error = json!({"type": "error", "code": "rate_limit_exceeded", "message": "slow"});
        let limited = feed(&mut Assembler::default(), error);
        assert!(
            matches!(limited, Err(ProviderError::Transient { .. })),
            "{limited:?}"
        );
    }

    #[test]
    fn an_incomplete_response_ends_with_its_reason() {
        let mut assembler = Assembler::default();
        let delta = json!({"type": "response.output_text.delta", "delta": "Partial"});
        assert!(!feed(&mut assembler, delta).unwrap());
        let incomplete = json!({"type": "response.incomplete", "response": {
            "model": "gpt-x", "incomplete_details": {"reason": "max_output_tokens"},
            "usage": {"input_tokens": 7, "output_tokens": 3}}});
        assert!(feed(&mut assembler, incomplete).unwrap());
        let response = Box::new(assembler).finish("asked");
        assert_eq!(response.finish_reason.as_deref(), Some("length"));
        assert_eq!(response.model, "gpt-x");
        assert_eq!(response.usage.prompt_tokens, 7);
        assert_eq!(
            response.message,
            Message::Assistant {
                thinking: Vec::new(),
                content: Some("Partial".into()),
                tool_calls: vec![]
            }
        );
    }
}
