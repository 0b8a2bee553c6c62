//! Client-orchestrated runs over real HTTP against real Postgres, with a worker running: a
//! run its client holds is never queued, gated or picked up by a worker (boot recovery
//! included); the client's steps, events and end join the run's stream in sequence; a
//! wrong token, a second active run and a late append are refused; a lapsed lease fails
//! the run.

use std::time::Duration;

use crate::support;
use crate::support::{Client, TestApp, shell, wait_for};
use keel_client::{
    ClientArtifact, ClientEvent, ClientFinish, ClientOutcome, ClientRunRequest, ClientStep,
    EventType, RunEventsRequest, RunStatus,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

const SOON: Duration = Duration::from_secs(20);

fn append(token: &str) -> RunEventsRequest {
    RunEventsRequest {
        lease_token: token.to_string(),
        events: Vec::new(),
        steps: Vec::new(),
        artifacts: Vec::new(),
        finish: None,
    }
}

#[tokio::test]
async fn a_client_holds_its_run_and_records_steps_events_and_its_end() {
    // Shell runs wait for an approval here: a client's run is behind no gate.
    let app = TestApp::with_approvals("shell_exec").await;
    let (c, api) = (&app.client, &app.client.api);
    let task = c.create_task(&shell("echo a worker would run this")).await;
    let started = api.start_client_run(&task.id, &ClientRunRequest::default());
    let (status, started) = started.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    let (run, token) = (started.data.run, started.data.lease_token);
    assert_eq!(run.status, RunStatus::Running);
    assert!(token.starts_with("kcl_") && token.len() == 68, "{token}");
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM queue_jobs WHERE ref_id = $1")
        .bind(&run.id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(queued, 0, "never queued for a worker");
    assert_eq!(keel::maintenance::recover(&app.pool).await.unwrap(), 0);
    let pending = api.list_task_approvals(&task.id, None).await.unwrap().data;
    assert!(pending.is_empty(), "no gate: {pending:?}");
    let stored: String = sqlx::query_scalar("SELECT token_sha256 FROM client_leases")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(
        !stored.contains(&token) && stored.len() == 64,
        "only the hash is kept"
    );

    let second = api.start_client_run(&task.id, &ClientRunRequest::default());
    let refused = second.send_with_status().await.unwrap_err().to_string();
    assert!(refused.contains("already has an active run"), "{refused}");
    let stranger = api.append_run_events(&task.id, &run.id, &append("kcl_not_the_token"));
    let refused = stranger.send_with_status().await.unwrap_err().to_string();
    assert!(refused.contains("does not hold run"), "{refused}");

    let work = RunEventsRequest {
        steps: vec![ClientStep {
            name: "read.tests".into(),
            status: ClientOutcome::Completed,
            input: json!({ "path": "tests/" }),
            output: Some(json!({ "files": 3 })),
            error: None,
        }],
        events: vec![
            ClientEvent {
                kind: "message".into(),
                data: json!({ "text": "reading the tests" }),
            },
            ClientEvent {
                kind: "tool.started".into(),
                data: json!({}),
            },
        ],
        artifacts: vec![ClientArtifact {
            name: "notes.md".into(),
            content_type: Some("text/markdown".into()),
            text: "# found\nthree test files\n".into(),
        }],
        ..append(&token)
    };
    let accepted = api.append_run_events(&task.id, &run.id, &work).send().await;
    let accepted = accepted.unwrap().data;
    assert_eq!(accepted.appended, 5);
    assert!(accepted.lease_expires_at.unwrap() > started.data.lease_expires_at);
    let artifacts = api.list_artifacts(&task.id, &run.id).await.unwrap().data;
    let notes = artifacts.iter().find(|a| a.name == "notes.md").unwrap();
    assert_eq!(notes.content_type, "text/markdown");
    assert_eq!(notes.size_bytes, 25);
    let text = c.artifact_text(&task.id, &run.id, &notes.id).await;
    assert_eq!(text, "# found\nthree test files\n");
    let again = RunEventsRequest {
        artifacts: work.artifacts.clone(),
        ..append(&token)
    };
    let twice = api
        .append_run_events(&task.id, &run.id, &again)
        .send_with_status()
        .await;
    let refused = twice.unwrap_err().to_string();
    assert!(
        refused.contains("already has an artifact named notes.md"),
        "{refused}"
    );
    let done = RunEventsRequest {
        finish: Some(ClientFinish {
            status: ClientOutcome::Completed,
            error: None,
        }),
        ..append(&token)
    };
    let ended = api.append_run_events(&task.id, &run.id, &done).send().await;
    let ended = ended.unwrap().data;
    assert_eq!(ended.run.status, RunStatus::Completed);
    assert!(ended.lease_expires_at.is_none());

    let events = c.events(&task.id, &run.id).await;
    let types: Vec<EventType> = events.iter().map(|e| e.event_type).collect();
    let expected = [
        EventType::RunCreated,
        EventType::TaskUpdated,
        EventType::RunStarted,
        EventType::StepStarted,
        EventType::StepFinished,
        EventType::ArtifactCreated,
        EventType::ClientEvent,
        EventType::ClientEvent,
        EventType::TaskUpdated,
        EventType::RunFinished,
    ];
    assert_eq!(types, expected);
    let sequences: Vec<i64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(sequences, (1..=10).collect::<Vec<_>>());
    assert_eq!(
        events[6].data,
        json!({ "kind": "message", "data": { "text": "reading the tests" } })
    );
    let steps = api.list_steps(&task.id, &run.id).await.unwrap().data;
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["read.tests"], "no worker ran the task");
    let late = api
        .append_run_events(&task.id, &run.id, &work)
        .send_with_status()
        .await;
    assert!(late.unwrap_err().to_string().contains("is completed"));
    let feed = c
        .feed_when("/v1/events?event_type=client.event", |e| e.len() == 2)
        .await;
    assert!(
        feed.data
            .iter()
            .all(|e| e.run_id.as_deref() == Some(run.id.as_str()))
    );
}

#[tokio::test]
async fn a_lapsed_lease_fails_the_run_and_fences_the_late_client() {
    let app = TestApp::start().await;
    let (c, api) = (&app.client, &app.client.api);
    let task = c.create_task(&shell("true")).await;
    let request = ClientRunRequest {
        lease_ms: Some(1_000),
        reason: Some("a short session".into()),
    };
    let started = api
        .start_client_run(&task.id, &request)
        .send()
        .await
        .unwrap()
        .data;
    let run_id = started.run.id.clone();
    let failed = wait_for(SOON, "the lapsed run to fail", || async {
        let run = c.run(&task.id, &run_id).await;
        (run.status == RunStatus::Failed).then_some(run)
    })
    .await;
    let error = failed.last_error.unwrap_or_default();
    assert!(error.starts_with("client_lease_expired"), "{error}");
    let late = api.append_run_events(&task.id, &run_id, &append(&started.lease_token));
    let refused = late.send_with_status().await.unwrap_err().to_string();
    assert!(refused.contains("is failed"), "{refused}");
    let events = c.events(&task.id, &run_id).await;
    assert_eq!(events.last().unwrap().event_type, EventType::RunFailed);
    // A bad body is the document's 4xx, not a 500.
    let (status, body) = c
        .post(
            &format!("/v1/tasks/{}/client-runs", task.id),
            json!({ "lease_ms": 5 }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

/// A client run of a new task, held by `client`: its task, its run and its lease token.
struct Held {
    task_id: String,
    run_id: String,
    token: String,
}

async fn hold(client: &Client, lease_ms: u64) -> Held {
    let task = client.create_task(&shell("true")).await;
    let path = format!("/v1/tasks/{}/client-runs", task.id);
    let (status, body) = client.post(&path, json!({ "lease_ms": lease_ms })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    Held {
        task_id: task.id,
        run_id: body["data"]["run"]["id"].as_str().unwrap().to_string(),
        token: body["data"]["lease_token"].as_str().unwrap().to_string(),
    }
}

/// Appends `body`'s steps, artifacts, events or end to the held run, as raw JSON.
async fn send(client: &Client, held: &Held, body: Value) -> (StatusCode, Value) {
    let path = format!("/v1/tasks/{}/runs/{}/events", held.task_id, held.run_id);
    let mut body = body;
    body["lease_token"] = json!(held.token);
    client.post(&path, body).await
}

/// An append of one text artifact of `bytes` bytes.
fn artifact_of(name: &str, bytes: usize) -> Value {
    json!({ "artifacts": [{ "name": name, "text": "k".repeat(bytes) }], "finish": null })
}

/// What the database counts the workspace as storing, and what its artifacts hold.
async fn workspace_bytes(pool: &sqlx::PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT stored_bytes FROM workspace_storage WHERE workspace_id = 'default'),
                (SELECT sum(size_bytes)::bigint FROM artifacts WHERE workspace_id = 'default')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// What a client's appends store is held to the run's quota (100 000 bytes here) and the
/// workspace's (150 000): an append past either is refused whole with 413
/// `storage_quota_exceeded`, and appends racing on two runs take the workspace exactly to
/// its quota, never past it. A run over its quota can still be ended.
#[tokio::test]
async fn client_appends_stop_at_the_run_s_and_the_workspace_s_byte_quota() {
    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let quotas = [
        ("KEEL_RUN_MAX_STORED_BYTES", "100000"),
        ("KEEL_WORKSPACE_MAX_STORED_BYTES", "150000"),
    ];
    let api = support::spawn_api_with_env(&db, logs.path(), "api", &quotas).await;
    let (c, pool) = (api.client.clone().unwrap(), support::pool(&db).await);
    let first = hold(&c, 60_000).await;
    let (status, body) = send(&c, &first, artifact_of("first", 60_000)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = send(&c, &first, artifact_of("second", 60_000)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["type"], "storage_quota_exceeded", "{body}");
    let over = format!(
        "storage_quota_exceeded: run {} would store 120000 bytes, over its quota of 100000 bytes",
        first.run_id
    );
    assert_eq!(body["error"]["message"], over, "{body}");

    // 90 000 bytes left in the workspace: three of these eight appends fit, whichever.
    let (second, third) = (hold(&c, 60_000).await, hold(&c, 60_000).await);
    let appends = (0..8).map(|i| {
        let held = if i % 2 == 0 { &second } else { &third };
        send(&c, held, artifact_of(&format!("note-{i}"), 30_000))
    });
    let answers = futures_util::future::join_all(appends).await;
    let accepted = answers.iter().filter(|(s, _)| *s == StatusCode::OK).count();
    let refused = answers.iter().filter(|(s, body)| {
        *s == StatusCode::PAYLOAD_TOO_LARGE && body["error"]["type"] == "storage_quota_exceeded"
    });
    assert_eq!((accepted, refused.count()), (3, 5), "{answers:?}");
    assert_eq!(workspace_bytes(&pool).await, (150_000, 150_000));

    let (status, body) = send(
        &c,
        &third,
        json!({ "events": [{ "kind": "note", "data": {} }] }),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "a full workspace: {body}"
    );
    let end = json!({ "finish": { "status": "completed" } });
    let (status, body) = send(&c, &first, end).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["run"]["status"], "completed", "{body}");
}

/// Appends renew a client's lease up to the longest a client may hold its run (3 s here)
/// and no further: a client that keeps appending is refused once that has passed, and its
/// run fails as `client_lease_max_reached`.
#[tokio::test]
async fn a_client_that_keeps_appending_lets_go_of_its_run_at_the_longest_lease() {
    let db = support::fresh_database().await;
    let (logs, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let max = [("KEEL_CLIENT_LEASE_MAX_MS", "3000")];
    let api = support::spawn_api_with_env(&db, logs.path(), "api", &max).await;
    let _worker =
        support::spawn_worker_with_env(&db, logs.path(), "worker", 2_000, data.path(), &max);
    let c = api.client.clone().unwrap();
    let held = hold(&c, 2_000).await;
    let created = c.run(&held.task_id, &held.run_id).await.created_at;
    let longest = created + chrono::Duration::milliseconds(3_000);
    let refusal = wait_for(SOON, "an append to be refused", || async {
        let (status, body) = send(&c, &held, json!({ "finish": null })).await;
        if status == StatusCode::OK {
            let expires: chrono::DateTime<chrono::Utc> =
                serde_json::from_value(body["data"]["lease_expires_at"].clone()).unwrap();
            assert!(expires <= longest, "renewed to {expires}, past {longest}");
            return None;
        }
        Some((status, body))
    })
    .await;
    let (status, body) = refusal;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let action = body["error"]["operator_action"].as_str().unwrap();
    assert!(action.contains("keel runs client-start"), "{body}");
    // The append past the longest lease is refused for it; or, when the workers'
    // maintenance failed the run at that moment first, for the run having ended (why it
    // ended is checked below).
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("client_lease_max_reached") || message.contains("is failed"),
        "{message}"
    );
    let failed = wait_for(SOON, "the held run to fail", || async {
        let run = c.run(&held.task_id, &held.run_id).await;
        (run.status == RunStatus::Failed).then_some(run)
    })
    .await;
    let error = failed.last_error.unwrap_or_default();
    assert!(error.starts_with("client_lease_max_reached: "), "{error}");
}
