//! The agent figure: Keel's own time per model call of an agent loop. Real `keel api` and
//! `keel worker` processes run agent tasks against an instant local model that speaks
//! OpenAI chat completions (streamed): each run makes `--agent-calls` calls, every one but
//! the last asking for one `list_dir` call. The model's server records when each call
//! arrived and when it answered, so the gap between an answer and the next call of the
//! same run is everything Keel does between two calls: persist the response, dispatch the
//! tool, persist its result, send the next request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::extract::State;
use axum::response::IntoResponse;
use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;

use super::RunArgs;
use super::children;
use super::runs::Deployment;
use super::stats::Latency;

/// The model's API key: it must resolve through the secret policy (`*_API_KEY`).
const KEY_ENV: &str = "BENCH_MODEL_API_KEY";

#[derive(Debug, Serialize, Deserialize)]
pub struct AgentFigures {
    pub runs: usize,
    pub calls_per_run: usize,
    pub concurrency: usize,
    /// Runs that ended other than `completed` (expected: none).
    pub failed: usize,
    /// From a model answer to the next call of the same run.
    pub overhead: Latency,
    /// Model calls completed per second over the whole figure.
    pub calls_per_s: f64,
}

/// When each call of each run reached the model and when it was answered.
#[derive(Default)]
struct Calls {
    /// Per run (its prompt): (arrived, answered), in call order.
    by_run: HashMap<String, Vec<(Instant, Instant)>>,
}

type Shared = Arc<(Mutex<Calls>, usize)>;

pub async fn figures(pool: &PgPool, url: &str, args: &RunArgs) -> anyhow::Result<AgentFigures> {
    children::in_data_dir("keel-bench-agent", |data_dir| async move {
        measure(pool, url, args, &data_dir).await
    })
    .await
}

async fn measure(
    pool: &PgPool,
    url: &str,
    args: &RunArgs,
    data_dir: &std::path::Path,
) -> anyhow::Result<AgentFigures> {
    let calls: Shared = Arc::new((Mutex::default(), args.agent_calls.max(1)));
    let model = serve_model(calls.clone()).await?;
    let env = [
        (KEY_ENV, "bench-key"),
        ("KEEL_CHAT_ALLOW_PRIVATE_ADDRESSES", "true"),
    ];
    let deployment = Deployment::start(pool, url, data_dir, 1, args.concurrency, &env).await?;
    let provider = create_provider(&deployment, &model).await?;
    let first = Instant::now();
    let _: Vec<String> = futures_util::stream::iter(0..args.agent_runs)
        .map(|i| start_agent_run(&deployment, &provider, i))
        .buffer_unordered(args.concurrency.max(1))
        .try_collect()
        .await?;
    let mut ended = deployment.ended.clone();
    ended.wait_for(|n| *n >= args.agent_runs).await?;
    let seconds = first.elapsed().as_secs_f64();
    let failed = deployment
        .arrivals
        .lock()
        .unwrap()
        .values()
        .flatten()
        .filter(|(event, _)| event != "run.started" && event != "run.finished")
        .count();
    deployment.stop(pool).await?;
    let calls = calls.0.lock().unwrap();
    let gaps: Vec<Duration> = calls
        .by_run
        .values()
        .flat_map(|run| {
            run.windows(2)
                .map(|w| w[1].0.saturating_duration_since(w[0].1))
        })
        .collect();
    let made: usize = calls.by_run.values().map(Vec::len).sum();
    Ok(AgentFigures {
        runs: args.agent_runs,
        calls_per_run: args.agent_calls,
        concurrency: args.concurrency,
        failed,
        overhead: Latency::of(&gaps)
            .with_context(|| format!("no run made two model calls ({failed} runs failed)"))?,
        calls_per_s: made as f64 / seconds,
    })
}

/// Starts the instant model on a free local port; returns its base URL.
async fn serve_model(calls: Shared) -> anyhow::Result<String> {
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(complete))
        .with_state(calls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}/v1", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(base)
}

/// Answers at once: a `list_dir` call until the run has made its calls, then text.
async fn complete(State(calls): State<Shared>, body: axum::Json<Value>) -> impl IntoResponse {
    let arrived = Instant::now();
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let run = messages
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string();
    let made = messages.iter().filter(|m| m["role"] == "assistant").count();
    let delta = if made + 1 < calls.1 {
        json!({ "role": "assistant", "tool_calls": [{ "index": 0, "id": format!("call_{made}"),
            "type": "function", "function": { "name": "list_dir", "arguments": "{}" } }] })
    } else {
        json!({ "role": "assistant", "content": "done" })
    };
    let finish = if delta.get("tool_calls").is_some() {
        "tool_calls"
    } else {
        "stop"
    };
    let chunk = |choices: Value, usage: Value| {
        json!({ "id": "bench", "object": "chat.completion.chunk", "created": 0,
                "model": "bench-model", "choices": choices, "usage": usage })
    };
    let frames = [
        chunk(
            json!([{ "index": 0, "delta": delta, "finish_reason": null }]),
            Value::Null,
        ),
        chunk(
            json!([{ "index": 0, "delta": {}, "finish_reason": finish }]),
            Value::Null,
        ),
        chunk(
            json!([]),
            json!({ "prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12 }),
        ),
    ];
    let mut text: String = frames.iter().map(|f| format!("data: {f}\n\n")).collect();
    text.push_str("data: [DONE]\n\n");
    let mut recorded = calls.0.lock().unwrap();
    let run_calls = recorded.by_run.entry(run).or_default();
    run_calls.push((arrived, Instant::now()));
    ([("content-type", "text/event-stream")], text)
}

async fn create_provider(deployment: &Deployment, model: &str) -> anyhow::Result<String> {
    let body = json!({ "kind": "openai", "model": "bench-model", "api": "openai-completions",
        "base_url": model, "api_key_ref": format!("env:{KEY_ENV}"),
        "capabilities": ["chat", "tool_call"], "enabled": true });
    let preset: Value = deployment
        .http
        .post(format!("{}/v1/providers", deployment.base))
        .json(&body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(preset["data"]["id"]
        .as_str()
        .context("provider response without an id")?
        .to_string())
}

/// Creates an agent task whose prompt names the run, and starts it.
async fn start_agent_run(
    deployment: &Deployment,
    provider: &str,
    i: usize,
) -> anyhow::Result<String> {
    let (http, base) = (&deployment.http, &deployment.base);
    let task: Value = http
        .post(format!("{base}/v1/tasks"))
        .json(
            &json!({ "execution_kind": "agent_loop", "prompt": format!("bench run {i}"),
            "requested_provider": provider, "tools": ["list_dir"] }),
        )
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let task_id = task["data"]["id"]
        .as_str()
        .context("task response without an id")?
        .to_string();
    http.post(format!("{base}/v1/tasks/{task_id}/start"))
        .send()
        .await?
        .error_for_status()?;
    Ok(task_id)
}
