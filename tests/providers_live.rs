//! The live check of chat presets (`POST /v1/providers/{id}/check?live=true`) against the
//! fake LLM of tests/support/llm.rs, and that fake's own wire behaviour.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::llm::{FakeLlm, Turn};

/// The SSE `data:` payloads of a response body.
fn data_lines(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn the_fake_llm_streams_scripted_turns_in_pieces_and_counts_completed_ones() {
    let llm = FakeLlm::start(vec![
        Turn::text("Hello there").and_tool_call("call_1", "read_file", r#"{"path":"a.txt"}"#),
        Turn::tool_call("toolu_1", "grep", r#"{"pattern":"x"}"#).usage(30, 4, 20),
        Turn::error(429, "slow down").retry_after("2"),
    ])
    .await
    .require_key("sk-fake");
    let http = reqwest::Client::new();
    let body = json!({"model": "m1", "messages": [{"role": "user", "content": "hi"}]});

    let openai = http
        .post(format!("{}/chat/completions", llm.openai_base()))
        .bearer_auth("sk-fake")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(openai.status(), 200);
    let chunks = data_lines(&openai.text().await.unwrap());
    assert_eq!(chunks.last().unwrap(), "[DONE]");
    let parsed: Vec<Value> = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| serde_json::from_str(c).unwrap())
        .collect();
    let text: String = parsed
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello there");
    let arguments: Vec<&str> = parsed
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .filter(|a| !a.is_empty())
        .collect();
    assert!(
        arguments.len() > 1,
        "arguments arrive in pieces: {arguments:?}"
    );
    assert_eq!(arguments.concat(), r#"{"path":"a.txt"}"#);

    let anthropic = http
        .post(format!("{}/v1/messages", llm.anthropic_base()))
        .header("x-api-key", "sk-fake")
        .json(&body)
        .send()
        .await
        .unwrap();
    let events = data_lines(&anthropic.text().await.unwrap());
    let start: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(start["message"]["usage"]["input_tokens"], 10);
    assert_eq!(start["message"]["usage"]["cache_read_input_tokens"], 20);
    llm.wait_for_completed(2, Duration::from_secs(5)).await;

    let wrong_key = http
        .post(format!("{}/chat/completions", llm.openai_base()))
        .bearer_auth("nope")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_key.status(), 401);
    let limited = http
        .post(format!("{}/chat/completions", llm.openai_base()))
        .bearer_auth("sk-fake")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "2");
    assert_eq!(llm.requests().len(), 4);
    assert_eq!(llm.requests()[1].header("x-api-key"), Some("sk-fake"));
    assert_eq!(llm.completed(), 2);
}
