//! Lineage of agent loop runs over real HTTP and Postgres: continue, retry-from-model-call
//! and resume build the new run's `conversation_base` from the source's
//! `agent_conversation` artifact (the source's history is written with SQL, in the
//! worker's shapes, since no model runs here), and refuse what they must. Then live
//! deltas: a `pg_notify('keel_model_delta', …)` reaches the open streams of its run as
//! `model.delta` without an id, and no stream of another run or workspace.

use crate::support;
use crate::support::agent_rows;
use crate::support::two_orgs;

use std::time::Duration;

use crate::support::{Client, SseReader, TestApp, wait_for};
use agent_rows::{
    Call, assistant, assistant_calling, conversation_artifact, model_call, tool, tool_call, user,
};
use keel_client::{RunRecord, RunStatus};
use reqwest::StatusCode;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(20);

const CALL: Call<'static> = Call {
    provider: "chat",
    model: "gpt-test",
    prompt_tokens: 100,
    completion_tokens: 10,
    cached_tokens: 0,
    cost_micros_usd: Some(75),
};

/// An agent loop task with a chat preset to resolve; its first run stays queued (no worker).
async fn agent_task(c: &Client) -> (String, String) {
    let (status, preset) = c
        .post(
            "/v1/providers",
            json!({ "kind": "openai-compatible", "model": "gpt-test", "api": "openai-completions",
                    "base_url": "http://127.0.0.1:9/v1", "capabilities": ["chat"], "enabled": true }),
        )
        .await;
    assert!(status.is_success(), "{preset}");
    c.start_task(&support::agent_loop("fix the bug")).await
}

async fn cancel(c: &Client, task_id: &str, run_id: &str) {
    let (status, body) = c
        .post_empty(&format!("/v1/tasks/{task_id}/runs/{run_id}/cancel"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

async fn lineage(
    c: &Client,
    task_id: &str,
    run_id: &str,
    action: &str,
    body: Value,
) -> (StatusCode, Value) {
    c.post(&format!("/v1/tasks/{task_id}/runs/{run_id}/{action}"), body)
        .await
}

/// Admits a lineage run (201) and returns it.
async fn admitted(c: &Client, task_id: &str, run_id: &str, action: &str, body: Value) -> RunRecord {
    let (status, run) = lineage(c, task_id, run_id, action, body).await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(run["object"], "task_run");
    support::record(&run)
}

fn assert_refused(reply: (StatusCode, Value), status: StatusCode, words: &str) {
    let (got, body) = reply;
    assert_eq!(got, status, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(words), "{message}");
}

async fn base_of(pool: &sqlx::PgPool, run_id: &str) -> Value {
    sqlx::query_scalar::<_, Option<Value>>("SELECT conversation_base FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(pool)
        .await
        .unwrap()
        .unwrap_or(Value::Null)
}

async fn workspace_run_of(pool: &sqlx::PgPool, run_id: &str) -> Option<String> {
    sqlx::query_scalar("SELECT workspace_run_id FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The source's history: a tool-calling response, its tool result, and a final answer.
fn source_conversation() -> Vec<Value> {
    vec![
        user("fix the bug"),
        assistant_calling("t1"),
        tool("t1", "fn main() {}"),
        assistant("fixed"),
    ]
}

async fn record_source_history(pool: &sqlx::PgPool, run_id: &str) {
    model_call(pool, run_id, 1, CALL, assistant_calling("t1")).await;
    tool_call(pool, run_id, "t1", "fn main() {}").await;
    model_call(pool, run_id, 2, CALL, assistant("fixed")).await;
    let conversation = serde_json::to_vec(&source_conversation()).unwrap();
    conversation_artifact(pool, run_id, &conversation).await;
}

#[tokio::test]
async fn continue_retry_from_model_call_and_resume_build_the_conversation() {
    let app = TestApp::api_only().await;
    let (c, pool) = (&app.client, &app.pool);
    let (task, source) = agent_task(c).await;

    // While the source is active: 409, for both.
    let prompt = json!({ "prompt": "now add a test" });
    assert_refused(
        lineage(c, &task, &source, "continue", prompt.clone()).await,
        StatusCode::CONFLICT,
        "only a finished run",
    );
    assert_refused(
        lineage(
            c,
            &task,
            &source,
            "retry-from-model-call",
            json!({ "model_call_index": 1 }),
        )
        .await,
        StatusCode::CONFLICT,
        "only a finished run",
    );
    cancel(c, &task, &source).await;

    // Finished, but nothing to start from: no artifact, then a malformed one.
    assert_refused(
        lineage(c, &task, &source, "continue", prompt.clone()).await,
        StatusCode::BAD_REQUEST,
        "no agent_conversation artifact",
    );
    conversation_artifact(pool, &source, b"{\"not\": \"a conversation\"").await;
    assert_refused(
        lineage(c, &task, &source, "continue", prompt.clone()).await,
        StatusCode::BAD_REQUEST,
        "not a readable conversation",
    );
    sqlx::query("DELETE FROM artifacts WHERE run_id = $1")
        .bind(&source)
        .execute(pool)
        .await
        .unwrap();
    record_source_history(pool, &source).await;
    let run = c.run(&task, &source).await;
    assert_eq!(run.model_call_count, 2);
    assert_eq!(run.total_cost_micros_usd, 150);
    assert_eq!(run.model.as_deref(), Some("gpt-test"));

    // Empty prompts are refused.
    for body in [json!({ "prompt": "" }), json!({ "prompt": "  \n" })] {
        let (status, reply) = lineage(c, &task, &source, "continue", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    }

    // Continue: the source's conversation and the user turn, in the source's workspace,
    // with its cost; the run is the task's active one.
    let continued = admitted(c, &task, &source, "continue", prompt.clone()).await;
    assert_eq!(continued.status, RunStatus::Queued);
    assert_eq!(continued.lineage_kind.as_deref(), Some("continue"));
    assert_eq!(continued.resumed_from_run_id.as_ref(), Some(&source));
    assert_eq!(continued.prior_cost_micros_usd, 150);
    assert_eq!(continued.total_cost_micros_usd, 0);
    assert_eq!(continued.model_call_count, 0);
    assert!(continued.from_model_call_index.is_none());
    let continued_id = continued.id;
    let mut expected = source_conversation();
    expected.push(user("now add a test"));
    assert_eq!(base_of(pool, &continued_id).await, json!(expected));
    assert_eq!(
        workspace_run_of(pool, &continued_id).await.as_deref(),
        Some(source.as_str())
    );
    assert_refused(
        lineage(c, &task, &source, "continue", json!({ "prompt": "again" })).await,
        StatusCode::CONFLICT,
        "already has an active run",
    );
    cancel(c, &task, &continued_id).await;

    // Retry from model call N: 1-based, within the source's own count.
    for index in [json!(0), json!(3), json!(-1), json!(4_294_967_297i64)] {
        let body = json!({ "model_call_index": index });
        assert_refused(
            lineage(c, &task, &source, "retry-from-model-call", body).await,
            StatusCode::BAD_REQUEST,
            "model_call_index must be between 1 and the run's model_call_count (2)",
        );
    }
    let body = json!({ "model_call_index": 2, "reason": "explore an alternative" });
    let second = admitted(c, &task, &source, "retry-from-model-call", body).await;
    assert_eq!(
        second.lineage_kind.as_deref(),
        Some("retry_from_model_call")
    );
    assert_eq!(second.from_model_call_index, Some(2));
    assert_eq!(second.resumed_from_run_id.as_ref(), Some(&source));
    assert_eq!(second.prior_cost_micros_usd, 150);
    assert_eq!(second.model_call_count, 0);
    let second_id = second.id;
    // Cut immediately before the second response: the tool result is the last message.
    assert_eq!(
        base_of(pool, &second_id).await,
        json!(source_conversation()[..3])
    );
    cancel(c, &task, &second_id).await;
    let first = admitted(
        c,
        &task,
        &source,
        "retry-from-model-call",
        json!({ "model_call_index": 1 }),
    )
    .await;
    let first_id = first.id;
    assert_eq!(base_of(pool, &first_id).await, json!([user("fix the bug")]));
    cancel(c, &task, &first_id).await;

    // The continued run answered once: its response is its call 1; the inherited ones are
    // not addressable from it.
    model_call(pool, &continued_id, 1, CALL, assistant("test added")).await;
    let mut continued_conversation = expected.clone();
    continued_conversation.push(assistant("test added"));
    let bytes = serde_json::to_vec(&continued_conversation).unwrap();
    conversation_artifact(pool, &continued_id, &bytes).await;
    let body = json!({ "model_call_index": 1 });
    let branch = admitted(c, &task, &continued_id, "retry-from-model-call", body).await;
    let branch_id = branch.id;
    assert_eq!(base_of(pool, &branch_id).await, json!(expected));
    assert_eq!(branch.prior_cost_micros_usd, 150 + 75);
    cancel(c, &task, &branch_id).await;
    assert_refused(
        lineage(
            c,
            &task,
            &continued_id,
            "retry-from-model-call",
            json!({ "model_call_index": 2 }),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "(1)",
    );

    // Resume of an agent loop run hydrates its saved conversation.
    let resumed = admitted(c, &task, &continued_id, "resume", json!({})).await;
    assert_eq!(resumed.lineage_kind.as_deref(), Some("resume"));
    let resumed_id = resumed.id;
    assert_eq!(
        base_of(pool, &resumed_id).await,
        json!(continued_conversation)
    );
    cancel(c, &task, &resumed_id).await;

    // An Idempotency-Key replays a continue with 200 and the same run.
    let keyed = || {
        c.http
            .post(format!("{}/v1/tasks/{task}/runs/{source}/continue", c.base))
            .header("Idempotency-Key", "continue-once")
            .json(&json!({ "prompt": "once" }))
    };
    let (status, one) = c.send(keyed()).await;
    assert_eq!(status, StatusCode::CREATED, "{one}");
    let (status, again) = c.send(keyed()).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    let one: RunRecord = support::record(&one);
    assert_eq!(one.id, support::record::<RunRecord>(&again).id);
    cancel(c, &task, &one.id).await;

    // Not an agent loop task: 400 for both; its resume is the usual one (no conversation).
    let (shell_task, shell_run) = c.run_shell("true").await;
    cancel(c, &shell_task, &shell_run).await;
    assert_refused(
        lineage(c, &shell_task, &shell_run, "continue", prompt.clone()).await,
        StatusCode::BAD_REQUEST,
        "only agent_loop runs",
    );
    assert_refused(
        lineage(
            c,
            &shell_task,
            &shell_run,
            "retry-from-model-call",
            json!({ "model_call_index": 1 }),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "only agent_loop runs",
    );
    let resumed_shell = admitted(c, &shell_task, &shell_run, "resume", json!({})).await;
    assert_eq!(resumed_shell.lineage_kind.as_deref(), Some("resume"));
    assert_eq!(base_of(pool, &resumed_shell.id).await, Value::Null);

    // Unknown runs and tasks are 404 as elsewhere.
    let (status, _) = lineage(c, &task, "run_0", "continue", prompt.clone()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = lineage(c, "task_0", &source, "continue", prompt).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// The next `model.delta` of a stream, skipping the run's logged events.
async fn next_delta(stream: &mut SseReader) -> support::SseEvent {
    loop {
        let event = stream.next(TIMEOUT).await.expect("a model.delta in time");
        if event.event.as_deref() == Some("model.delta") {
            return event;
        }
        assert!(event.id.is_some(), "logged events have ids: {event:?}");
    }
}

async fn notify(pool: &sqlx::PgPool, payload: Value) {
    sqlx::query("SELECT pg_notify('keel_model_delta', $1)")
        .bind(payload.to_string())
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn model_deltas_reach_the_streams_of_their_run_alone() {
    let stack = two_orgs::stack().await;
    let pool = &stack.pool;
    let (a_task, a_run) = stack.a.run_shell("true").await;
    let (a_task2, a_run2) = stack.a.run_shell("true").await;
    let (b_task, b_run) = stack.b.run_shell("true").await;
    let a_ws = two_orgs::workspace_of(pool, &a_run).await;
    let b_ws = two_orgs::workspace_of(pool, &b_run).await;
    let stream_path = |task: &str, run: &str| format!("/v1/tasks/{task}/runs/{run}/stream");
    let mut a_stream = SseReader::open(&stack.a, &stream_path(&a_task, &a_run), None).await;
    let mut a_stream2 = SseReader::open(&stack.a, &stream_path(&a_task2, &a_run2), None).await;
    let mut b_stream = SseReader::open(&stack.b, &stream_path(&b_task, &b_run), None).await;
    let mut feed = SseReader::open(&stack.a, "/v1/events/stream", None).await;

    // The API process listens once its first stream opened (deltas are not replayed).
    let listener = listening_backend(pool, None).await;

    let delta = |ws: &str, task: &str, run: &str, index: i64, text: &str| {
        json!({ "workspace_id": ws, "task_id": task, "run_id": run,
                "model_call_index": index, "text": text })
    };
    // Misaddressed ones first: b's run under a's workspace, a's run under b's, garbage.
    notify(pool, delta(&a_ws, &b_task, &b_run, 1, "wrong workspace")).await;
    notify(
        pool,
        delta(&b_ws, &a_task, &a_run, 1, "wrong workspace too"),
    )
    .await;
    notify(pool, json!({ "not": "a delta" })).await;
    // Then one for each run, in order: each stream's first delta must be its own.
    notify(pool, delta(&a_ws, &a_task, &a_run, 2, "Hel")).await;
    notify(pool, delta(&a_ws, &a_task, &a_run, 2, "lo")).await;
    notify(pool, delta(&a_ws, &a_task2, &a_run2, 1, "other run")).await;
    notify(pool, delta(&b_ws, &b_task, &b_run, 3, "b's own")).await;

    let first = next_delta(&mut a_stream).await;
    assert_eq!(first.id, None, "deltas carry no id");
    assert_eq!(first.data, json!({ "model_call_index": 2, "text": "Hel" }));
    let second = next_delta(&mut a_stream).await;
    assert_eq!(second.id, None);
    assert_eq!(second.data, json!({ "model_call_index": 2, "text": "lo" }));
    let other = next_delta(&mut a_stream2).await;
    assert_eq!(
        other.data,
        json!({ "model_call_index": 1, "text": "other run" })
    );
    let own = next_delta(&mut b_stream).await;
    assert_eq!(
        own.data,
        json!({ "model_call_index": 3, "text": "b's own" })
    );

    // The listener's connection dies: it listens again, and deltas flow again.
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(listener)
        .execute(pool)
        .await
        .unwrap();
    listening_backend(pool, Some(listener)).await;
    notify(pool, delta(&a_ws, &a_task, &a_run, 3, "after the drop")).await;
    let after = next_delta(&mut a_stream).await;
    assert_eq!(
        after.data,
        json!({ "model_call_index": 3, "text": "after the drop" })
    );

    // The feed carries logged events only: up to a's cancellation, no delta.
    cancel(&stack.a, &a_task, &a_run).await;
    loop {
        let event = feed.next(TIMEOUT).await.expect("the feed's events");
        assert_ne!(event.event.as_deref(), Some("model.delta"));
        assert!(event.id.is_some());
        if event.event.as_deref() == Some("run.cancelled") && event.data["run_id"] == a_run {
            break;
        }
    }
    // a's stream ends after the run's terminal event; resumption by id is unaffected.
    let mut last_id = None;
    while let Some(event) = a_stream.next(TIMEOUT).await {
        assert_ne!(event.event.as_deref(), Some("model.delta"));
        last_id = event.id;
    }
    let events = stack.a.events(&a_task, &a_run).await;
    let sequences: Vec<String> = events.iter().map(|e| e.sequence.to_string()).collect();
    assert_eq!(last_id.as_ref(), sequences.last());

    // Once every stream has closed, the listener stops.
    drop((a_stream, a_stream2, b_stream, feed));
    wait_for(TIMEOUT, "the listener to stop", || async {
        listeners(pool).await.is_empty().then_some(())
    })
    .await;
}

/// The backends whose last statement was the API's `LISTEN keel_model_delta`.
async fn listeners(pool: &sqlx::PgPool) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND query ILIKE 'LISTEN%keel_model_delta%'
           AND state = 'idle'",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Waits for the one listening backend (other than `not`) and returns its pid.
async fn listening_backend(pool: &sqlx::PgPool, not: Option<i32>) -> i32 {
    wait_for(TIMEOUT, "the API to LISTEN on keel_model_delta", || async {
        match listeners(pool).await[..] {
            [pid] if Some(pid) != not => Some(pid),
            _ => None,
        }
    })
    .await
}
