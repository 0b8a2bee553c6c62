//! Agent loop rows written with SQL, in the shapes the worker persists (see
//! docs/api.md): a task turned into an `agent_loop` one, `model_call` and `tool_call` steps
//! with their `model_calls` ledger rows, and the `agent_conversation` artifact. The tests of
//! usage and lineage use them to give runs created through the API an agent loop's history
//! without a model.

use serde_json::{Value, json};
use sqlx::PgPool;

/// The usage of one model call.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub provider: &'a str,
    pub model: &'a str,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cached_tokens: i64,
    pub cost_micros_usd: Option<i64>,
}

/// The run's next step index.
async fn next_step(pool: &PgPool, run_id: &str) -> i32 {
    sqlx::query_scalar("SELECT COALESCE(max(index), 0) + 1 FROM steps WHERE run_id = $1")
        .bind(run_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A completed `model_call` step answering with `message`, its `model_calls` row (index
/// `index`), and the run's count, model, provider and cost; returns the ledger row's id.
pub async fn model_call(
    pool: &PgPool,
    run_id: &str,
    index: i32,
    call: Call<'_>,
    message: Value,
) -> String {
    let step_id = keel::domain::new_id("step");
    let call_id = keel::domain::new_id("mc");
    let step = next_step(pool, run_id).await;
    let response = json!({
        "message": message,
        "usage": { "prompt_tokens": call.prompt_tokens, "completion_tokens": call.completion_tokens,
                   "cached_tokens": call.cached_tokens },
        "model": call.model, "finish_reason": "stop",
    });
    sqlx::query(
        "INSERT INTO steps (id, run_id, task_id, index, name, status, input, output,
                            finished_at, workspace_id)
         SELECT $1, r.id, r.task_id, $3, 'model_call', 'completed', $4, $5, now(), r.workspace_id
         FROM runs r WHERE r.id = $2",
    )
    .bind(&step_id)
    .bind(run_id)
    .bind(step)
    .bind(json!({ "index": index }))
    .bind(json!({ "response": response, "cost_micros_usd": call.cost_micros_usd }))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO model_calls (id, workspace_id, task_id, run_id, step_id, index, provider,
                                  model, prompt_tokens, completion_tokens, cached_tokens,
                                  cost_micros_usd, duration_ms)
         SELECT $1, r.workspace_id, r.task_id, r.id, $3, $4, $5, $6, $7, $8, $9, $10, 12
         FROM runs r WHERE r.id = $2",
    )
    .bind(&call_id)
    .bind(run_id)
    .bind(&step_id)
    .bind(index)
    .bind(call.provider)
    .bind(call.model)
    .bind(call.prompt_tokens)
    .bind(call.completion_tokens)
    .bind(call.cached_tokens)
    .bind(call.cost_micros_usd)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE runs SET model_call_count = model_call_count + 1, model = $2, provider = $3,
                         total_cost_micros_usd = total_cost_micros_usd + COALESCE($4, 0)
         WHERE id = $1",
    )
    .bind(run_id)
    .bind(call.model)
    .bind(call.provider)
    .bind(call.cost_micros_usd)
    .execute(pool)
    .await
    .unwrap();
    call_id
}

/// A completed `tool_call` step.
pub async fn tool_call(pool: &PgPool, run_id: &str, tool_call_id: &str, content: &str) {
    let step = next_step(pool, run_id).await;
    sqlx::query(
        "INSERT INTO steps (id, run_id, task_id, index, name, status, input, output,
                            finished_at, workspace_id)
         SELECT $1, r.id, r.task_id, $3, 'tool_call', 'completed', $4, $5, now(), r.workspace_id
         FROM runs r WHERE r.id = $2",
    )
    .bind(keel::domain::new_id("step"))
    .bind(run_id)
    .bind(step)
    .bind(json!({ "tool_call_id": tool_call_id, "name": "read_file", "arguments": "{}" }))
    .bind(json!({ "result": { "content": content, "is_error": false, "patches": [] } }))
    .execute(pool)
    .await
    .unwrap();
}

/// Writes the run's `agent_conversation` artifact with `content` (any bytes: a test of a
/// malformed one passes text that is not a conversation).
pub async fn conversation_artifact(pool: &PgPool, run_id: &str, content: &[u8]) {
    let artifact_id = keel::domain::new_id("art");
    sqlx::query(
        "INSERT INTO artifacts (id, run_id, task_id, name, kind, content_type, size_bytes,
                                status, workspace_id)
         SELECT $1, r.id, r.task_id, 'agent_conversation', 'agent_conversation',
                'application/json', $3, 'complete', r.workspace_id
         FROM runs r WHERE r.id = $2",
    )
    .bind(&artifact_id)
    .bind(run_id)
    .bind(content.len() as i64)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO artifact_chunks (artifact_id, offset_bytes, data, size_bytes)
         VALUES ($1, 0, $2, $3)",
    )
    .bind(&artifact_id)
    .bind(content)
    .bind(content.len() as i64)
    .execute(pool)
    .await
    .unwrap();
}

pub fn user(text: &str) -> Value {
    json!({ "role": "user", "content": text })
}

pub fn assistant(text: &str) -> Value {
    json!({ "role": "assistant", "content": text })
}

pub fn assistant_calling(tool_call_id: &str) -> Value {
    json!({ "role": "assistant", "tool_calls": [
        { "id": tool_call_id, "name": "read_file", "arguments": "{}" }
    ] })
}

pub fn tool(tool_call_id: &str, content: &str) -> Value {
    json!({ "role": "tool", "tool_call_id": tool_call_id, "name": "read_file", "content": content })
}
