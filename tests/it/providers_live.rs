//! The live check of chat presets (`POST /v1/providers/{id}/check?live=true`) against the
//! fake LLM of tests/support/llm.rs, and that fake's own wire behaviour.

use crate::support;

use std::time::Duration;

use crate::support::Client;
use crate::support::llm::{FakeLlm, Turn};
use keel_client::{ProviderCheck, ProviderView};
use reqwest::StatusCode;
use serde_json::{Value, json};

const KEY_VAR: &str = "FAKE_LLM_API_KEY";
const KEY: &str = "sk-live-check-93e1-never-shown";

async fn create(client: &Client, api: &str, base_url: &str) -> String {
    let (status, body) = client
        .post(
            "/v1/providers",
            json!({"kind": "fake-llm", "model": "fake-chat-1", "api": api,
                "base_url": base_url, "api_key_ref": format!("env:{KEY_VAR}"),
                "capabilities": ["chat", "tool_call"], "enabled": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    support::record::<ProviderView>(&body).id
}

/// The check's status and body, raw: the body is searched for the key, and some queries
/// are refused.
async fn check(client: &Client, id: &str, query: &str) -> (StatusCode, Value) {
    client
        .post_empty(&format!("/v1/providers/{id}/check{query}"))
        .await
}

#[tokio::test]
async fn a_live_check_calls_the_chat_model_once_and_reports_its_error_without_the_key() {
    let llm = FakeLlm::start(vec![
        Turn::text("pong"),
        Turn::error(401, &format!("Invalid API key: {KEY}")),
    ])
    .await
    .require_key(KEY);
    let db_url = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let env = [
        (KEY_VAR, KEY),
        ("KEEL_CHAT_ALLOW_PRIVATE_ADDRESSES", "true"),
    ];
    let api = support::spawn_api_with_env(&db_url, logs.path(), "api", &env).await;
    let client = api.client.clone().unwrap();
    let openai = create(&client, "openai-completions", &llm.openai_base()).await;
    let anthropic = create(&client, "anthropic-messages", &llm.anthropic_base()).await;

    // Without `live` nothing is sent.
    let (status, body) = check(&client, &openai, "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let result: ProviderCheck = support::record(&body);
    assert_eq!(result.code, "ready");
    assert!(!result.live);
    assert!(llm.requests().is_empty());

    let (status, body) = check(&client, &openai, "?live=true").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let result: ProviderCheck = support::record(&body);
    assert!(result.ok, "{body}");
    assert_eq!(result.code, "ready");
    assert!(result.live);
    let ping = &llm.requests()[0];
    assert_eq!(
        ping.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(ping.body["model"], "fake-chat-1");
    assert_eq!(ping.body["max_tokens"], 1);
    assert_eq!(
        ping.body["messages"],
        json!([{"role": "user", "content": "ping"}])
    );
    assert!(ping.body.get("tools").is_none());
    assert_eq!(llm.completed(), 1);

    let (status, body) = check(&client, &anthropic, "?live=true").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let result: ProviderCheck = support::record(&body);
    assert!(!result.ok);
    assert_eq!(result.code, "live_call_failed");
    let message = result.message;
    assert!(
        message.contains("HTTP 401: Invalid API key: [redacted]"),
        "{message}"
    );
    assert_eq!(llm.requests()[1].body["max_tokens"], 1);
    // Read as sent too: its bytes are searched for the key below.
    let (stored, stored_raw) = client.api.get_provider(&anthropic).fetch().await.unwrap();
    let last_check = stored.data.last_check.unwrap_or_default();
    assert_eq!(last_check["code"], "live_call_failed");
    let stored = String::from_utf8_lossy(&stored_raw).into_owned();

    for text in [body.to_string(), stored, api.log_text()] {
        assert!(!text.contains(KEY), "the key leaked: {text}");
    }
}

#[tokio::test]
async fn live_checks_refuse_media_presets_and_private_addresses_by_default() {
    let llm = FakeLlm::start(vec![Turn::text("pong")]).await;
    let db_url = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let api = support::spawn_api_with_env(&db_url, logs.path(), "api", &[(KEY_VAR, KEY)]).await;
    let client = api.client.clone().unwrap();

    let chat = create(&client, "openai-completions", &llm.openai_base()).await;
    let (status, body) = check(&client, &chat, "?live=true").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let result: ProviderCheck = support::record(&body);
    assert_eq!(result.code, "live_call_failed");
    let message = result.message;
    assert!(
        message.contains("127.0.0.1 is not a public address"),
        "{message}"
    );
    assert!(llm.requests().is_empty());

    let (status, body) = client
        .post(
            "/v1/providers",
            json!({"kind": "openai-images", "model": "gpt-image-1", "api": "media-job",
                "base_url": "https://api.openai.com/v1", "api_key_ref": format!("env:{KEY_VAR}"),
                "capabilities": ["image_generate"], "enabled": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let media = support::record::<ProviderView>(&body).id;
    let media = media.as_str();
    let (status, body) = check(&client, media, "?live=true").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.to_string()
            .contains("live checks are for chat presets"),
        "{body}"
    );
    assert_eq!(
        check(&client, media, "?live=maybe").await.0,
        StatusCode::BAD_REQUEST
    );

    // A chat preset without a key (a model served locally) is ready.
    let (status, body) = client
        .post(
            "/v1/providers",
            json!({"kind": "local-llm", "model": "qwen", "api": "openai-completions",
                "base_url": "http://llm.internal:8000/v1", "capabilities": ["chat"],
                "enabled": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let keyless = support::record::<ProviderView>(&body).id;
    let (_, body) = check(&client, &keyless, "").await;
    let result: ProviderCheck = support::record(&body);
    assert_eq!(result.code, "ready", "{body}");
}

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
