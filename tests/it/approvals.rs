//! Approvals, resume and the audit trail, against a real Postgres with Keel in process.

use crate::support;

use std::time::Duration;

use crate::support::{Client, TestApp};
use reqwest::StatusCode;
use serde_json::{Value, json};

const RUN_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_POLICIES: &str = "shell_exec,git_exec,file_write";

async fn start(client: &Client, body: Value) -> (String, Value) {
    let task = client.create_task(body).await;
    let task_id = task["id"].as_str().unwrap().to_string();
    let (status, run) = client
        .post(&format!("/v1/tasks/{task_id}/start"), json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    (task_id, run["data"].clone())
}

async fn approvals_of(client: &Client, task_id: &str) -> Vec<Value> {
    let (status, body) = client.get(&format!("/v1/tasks/{task_id}/approvals")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["data"].as_array().unwrap().clone()
}

async fn resolve(
    client: &Client,
    task_id: &str,
    approval_id: &str,
    decision: &str,
) -> (StatusCode, Value) {
    let path = format!("/v1/tasks/{task_id}/approvals/{approval_id}/resolve");
    client
        .post(
            &path,
            json!({ "decision": decision, "note": "looked fine" }),
        )
        .await
}

async fn job_count(app: &TestApp, run_id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM queue_jobs WHERE ref_id = $1")
        .bind(run_id)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_gated_run_waits_for_approval_then_runs() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    let (task_id, run) = start(
        c,
        json!({ "execution_kind": "shell", "shell_command": "echo approved" }),
    )
    .await;
    let run_id = run["id"].as_str().unwrap();
    assert_eq!(run["status"], "awaiting_approval");
    let (_, task) = c.get(&format!("/v1/tasks/{task_id}")).await;
    assert_eq!(task["data"]["status"], "awaiting_approval");
    assert_eq!(
        job_count(&app, run_id).await,
        0,
        "a gated run is not enqueued"
    );

    let approvals = approvals_of(c, &task_id).await;
    assert_eq!(approvals.len(), 1);
    let approval = &approvals[0];
    assert_eq!(approval["kind"], "shell_command");
    assert_eq!(approval["status"], "pending");
    assert_eq!(approval["action_summary"][1], "  echo approved");
    assert_eq!(approval["action_summary_incomplete"], false);
    let approval_id = approval["id"].as_str().unwrap();
    let (status, one) = c
        .get(&format!("/v1/tasks/{task_id}/approvals/{approval_id}"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one["data"]["id"], approval["id"]);
    let (_, inbox) = c.get("/v1/approvals?status=pending").await;
    assert_eq!(inbox["data"][0]["id"], approval["id"]);

    let (status, resolved) = resolve(c, &task_id, approval_id, "approve").await;
    assert_eq!(status, StatusCode::OK, "{resolved}");
    assert_eq!(resolved["data"]["approval"]["status"], "approved");
    assert_eq!(resolved["data"]["approval"]["decision_note"], "looked fine");
    assert_eq!(resolved["data"]["run"]["status"], "queued");
    let run = c.wait_terminal(&task_id, run_id, RUN_TIMEOUT).await;
    assert_eq!(run["status"], "completed");

    let types: Vec<String> = c
        .events(&task_id, run_id)
        .await
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        &types[..4],
        [
            "run.created",
            "approval.requested",
            "approval.resolved",
            "run.queued"
        ]
    );
    let (_, inbox) = c.get("/v1/approvals?status=pending").await;
    assert_eq!(inbox["data"].as_array().unwrap().len(), 0);

    // Every transition of the run's life, in order, with who made it.
    let (_, trail) = c
        .get(&format!(
            "/v1/state-transitions?entity_type=run&entity_id={run_id}"
        ))
        .await;
    let steps: Vec<(Value, Value, String)> = trail["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["from_status"].clone(),
                t["to_status"].clone(),
                t["actor"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(steps.len(), 4, "{trail}");
    assert_eq!(
        (steps[0].0.clone(), steps[0].1.clone()),
        (Value::Null, json!("awaiting_approval"))
    );
    assert_eq!(
        (steps[1].0.clone(), steps[1].1.clone()),
        (json!("awaiting_approval"), json!("queued"))
    );
    assert_eq!(
        (steps[2].0.clone(), steps[2].1.clone()),
        (json!("queued"), json!("running"))
    );
    assert_eq!(
        (steps[3].0.clone(), steps[3].1.clone()),
        (json!("running"), json!("completed"))
    );
    assert_eq!(steps[0].2, "local");
    assert_eq!(steps[1].2, "local");
    assert!(steps[2].2.starts_with("worker:wrk_") && steps[3].2 == steps[2].2);
    let (_, task_trail) = c
        .get(&format!(
            "/v1/state-transitions?entity_type=task&entity_id={task_id}"
        ))
        .await;
    let task_states: Vec<&str> = task_trail["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["to_status"].as_str().unwrap())
        .collect();
    assert_eq!(
        task_states,
        [
            "not_started",
            "awaiting_approval",
            "queued",
            "running",
            "completed"
        ]
    );
    let (_, approval_trail) = c
        .get(&format!(
            "/v1/state-transitions?entity_type=approval&entity_id={approval_id}"
        ))
        .await;
    let approval_states: Vec<&str> = approval_trail["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["to_status"].as_str().unwrap())
        .collect();
    assert_eq!(approval_states, ["pending", "approved"]);
}

#[tokio::test]
async fn rejecting_cancels_the_run_and_a_second_resolve_conflicts() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    let (task_id, run) = start(
        c,
        json!({ "execution_kind": "shell", "shell_command": "true" }),
    )
    .await;
    let approval_id = approvals_of(c, &task_id).await[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, body) = resolve(c, &task_id, &approval_id, "reject").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let run = c.run(&task_id, run["id"].as_str().unwrap()).await;
    assert_eq!(run["status"], "cancelled");
    assert_eq!(run["last_error"], "approval rejected");
    let (_, task) = c.get(&format!("/v1/tasks/{task_id}")).await;
    assert_eq!(task["data"]["status"], "cancelled");
    for decision in ["approve", "reject"] {
        let (status, body) = resolve(c, &task_id, &approval_id, decision).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"]["type"], "conflict");
    }
}

#[tokio::test]
async fn concurrent_resolutions_have_exactly_one_winner() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    let (task_id, run) = start(
        c,
        json!({ "execution_kind": "shell", "shell_command": "true" }),
    )
    .await;
    let approval_id = approvals_of(c, &task_id).await[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let attempts = (0..10).map(|i| {
        let (c, task_id, approval_id) = (c.clone(), task_id.clone(), approval_id.clone());
        let decision = if i % 2 == 0 { "approve" } else { "reject" };
        tokio::spawn(async move { resolve(&c, &task_id, &approval_id, decision).await })
    });
    let results = futures_util::future::join_all(attempts).await;
    let statuses: Vec<StatusCode> = results.into_iter().map(|r| r.unwrap().0).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        1,
        "{statuses:?}"
    );
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::OK || *s == StatusCode::CONFLICT)
    );
    let resolved: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM state_transitions WHERE entity_type = 'approval' AND from_status = 'pending'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(resolved, 1);
    let _ = run;
}

#[tokio::test]
async fn cancel_and_resolve_race_to_one_consistent_outcome() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    for _ in 0..5 {
        let (task_id, run) = start(
            c,
            json!({ "execution_kind": "shell", "shell_command": "sleep 60" }),
        )
        .await;
        let run_id = run["id"].as_str().unwrap().to_string();
        let approval_id = approvals_of(c, &task_id).await[0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let cancel = {
            let (c, path) = (
                c.clone(),
                format!("/v1/tasks/{task_id}/runs/{run_id}/cancel"),
            );
            tokio::spawn(async move { c.post(&path, json!({})).await })
        };
        let approve = {
            let (c, task_id, approval_id) = (c.clone(), task_id.clone(), approval_id.clone());
            tokio::spawn(async move { resolve(&c, &task_id, &approval_id, "approve").await })
        };
        let (cancelled, approved) = (cancel.await.unwrap(), approve.await.unwrap());
        assert_eq!(cancelled.0, StatusCode::OK, "{}", cancelled.1);
        assert!(
            approved.0 == StatusCode::OK || approved.0 == StatusCode::CONFLICT,
            "{}",
            approved.1
        );
        let run = c.run(&task_id, &run_id).await;
        assert_eq!(run["status"], "cancelled", "cancel always ends the run");
        let approval = &approvals_of(c, &task_id).await[0];
        let expected = if approved.0 == StatusCode::OK {
            "approved"
        } else {
            "cancelled"
        };
        assert_eq!(approval["status"], expected);
        if expected == "cancelled" {
            assert_eq!(approval["resolved_by"], "system");
        }
        // A job the approval enqueued is removed by the cancel, or, when a worker had
        // already claimed it, acked by that worker as soon as it sees the cancellation.
        support::wait_for(
            Duration::from_secs(10),
            "a cancelled run to leave no job behind",
            || async { (job_count(&app, &run_id).await == 0).then_some(()) },
        )
        .await;
        // Approving after the cancellation is refused.
        let (status, _) = resolve(c, &task_id, &approval_id, "approve").await;
        assert_eq!(status, StatusCode::CONFLICT);
    }
}

#[tokio::test]
async fn expired_approvals_read_as_expired_and_cannot_be_approved() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    let (task_id, _) = start(
        c,
        json!({ "execution_kind": "shell", "shell_command": "true" }),
    )
    .await;
    let approval_id = approvals_of(c, &task_id).await[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    sqlx::query("UPDATE approvals SET expires_at = now() - interval '1 second'")
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(approvals_of(c, &task_id).await[0]["status"], "expired");
    let (_, inbox) = c.get("/v1/approvals?status=pending").await;
    assert!(inbox["data"].as_array().unwrap().is_empty());
    let (status, body) = resolve(c, &task_id, &approval_id, "approve").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired")
    );
}

#[tokio::test]
async fn policies_choose_the_gates() {
    let app = TestApp::with_approvals("all_tools").await;
    let c = &app.client;
    let (task_id, run) = start(
        c,
        json!({ "execution_kind": "git", "git_command": "clone https://example.invalid/repo.git" }),
    )
    .await;
    assert_eq!(run["status"], "awaiting_approval");
    let mut kinds: Vec<String> = approvals_of(c, &task_id)
        .await
        .iter()
        .map(|a| a["kind"].as_str().unwrap().to_string())
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["git_exec", "network_egress"]);
    // Approving one of two gates leaves the run waiting.
    let approvals = approvals_of(c, &task_id).await;
    let (_, first) = resolve(c, &task_id, approvals[0]["id"].as_str().unwrap(), "approve").await;
    assert_eq!(first["data"]["run"]["status"], "awaiting_approval");
    let (_, second) = resolve(c, &task_id, approvals[1]["id"].as_str().unwrap(), "approve").await;
    assert_eq!(second["data"]["run"]["status"], "queued");

    let file = start(
        c,
        json!({ "execution_kind": "file", "file_path": "a", "file_operation": "write",
                                "file_content": "very private contents" }),
    )
    .await;
    let approval = &approvals_of(c, &file.0).await[0];
    assert_eq!(approval["kind"], "file_write");
    let summary = approval["action_summary"].to_string();
    assert!(
        summary.contains("write file a (21 bytes)") && !summary.contains("private"),
        "{summary}"
    );
}

#[tokio::test]
async fn summaries_are_bounded_and_hide_secrets() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    let command: String = (0..30)
        .map(|i| {
            format!(
                "curl -H 'Authorization: Bearer sk-live-{i}' https://u:p4ss@host/{i} {}\n",
                "y".repeat(600)
            )
        })
        .collect();
    let (task_id, _) = start(
        c,
        json!({ "execution_kind": "shell", "shell_command": command }),
    )
    .await;
    let approval = &approvals_of(c, &task_id).await[0];
    let lines = approval["action_summary"].as_array().unwrap();
    assert!(lines.len() <= 16);
    assert!(lines.iter().all(|l| l.as_str().unwrap().len() <= 512));
    assert!(
        lines
            .iter()
            .map(|l| l.as_str().unwrap().len())
            .sum::<usize>()
            <= 4096
    );
    assert_eq!(approval["action_summary_incomplete"], true);
    let text = approval["action_summary"].to_string();
    assert!(
        !text.contains("sk-live") && !text.contains("p4ss"),
        "{text}"
    );
    let events = c
        .feed_when("/v1/events?event_type=approval.requested", |e| {
            !e.is_empty()
        })
        .await;
    assert!(!events.to_string().contains("sk-live"));
}

#[tokio::test]
async fn resolve_refuses_bad_input() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    let (task_id, _) = start(
        c,
        json!({ "execution_kind": "shell", "shell_command": "true" }),
    )
    .await;
    let approval_id = approvals_of(c, &task_id).await[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/v1/tasks/{task_id}/approvals/{approval_id}/resolve");
    let cases = [
        (
            json!({ "decision": "maybe" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "decision",
        ),
        (json!({}), StatusCode::UNPROCESSABLE_ENTITY, "decision"),
        (
            json!({ "decision": 1 }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "decision",
        ),
        (
            json!({ "decision": "approve", "by": "me" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "by",
        ),
        (
            json!({ "decision": "approve", "note": "n".repeat(5000) }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "note",
        ),
    ];
    for (body, status, mention) in cases {
        let (got, error) = c.post(&path, body.clone()).await;
        assert_eq!(got, status, "{body}: {error}");
        assert_eq!(error["error"]["type"], "invalid_request");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains(mention),
            "{error}"
        );
    }
    let (status, _) = c
        .post(
            &format!("/v1/tasks/{task_id}/approvals/apr_nope/resolve"),
            json!({ "decision": "approve" }),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = c
        .post(
            "/v1/tasks/task_nope/approvals/apr_nope/resolve",
            json!({ "decision": "approve" }),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        c.get("/v1/tasks/task_nope/approvals").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        c.get("/v1/approvals?status=sideways").await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        c.get("/v1/state-transitions?entity_type=planet").await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        c.get("/v1/runtime/leases?status=stolen").await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        c.get("/v1/runtime/leases?cursor=-3").await.0,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn resume_reuses_the_workspace_and_retry_starts_fresh() {
    let app = TestApp::start().await;
    let c = &app.client;
    let counter =
        "echo x >> count; wc -l < count; echo \"resumed from: $KEEL_RESUMED_FROM_RUN_ID\"";
    let (task_id, first) = start(
        c,
        json!({ "execution_kind": "shell", "shell_command": counter, "budget_micros_usd": 500 }),
    )
    .await;
    let first_id = first["id"].as_str().unwrap().to_string();
    c.wait_terminal(&task_id, &first_id, RUN_TIMEOUT).await;
    assert_eq!(c.stdout(&task_id, &first_id).await, "1\nresumed from: \n");

    let path = format!("/v1/tasks/{task_id}/runs/{first_id}/resume");
    let (status, resumed) = c
        .post(
            &path,
            json!({ "reason": "carry on", "budget_micros_usd": 100 }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{resumed}");
    let resumed = &resumed["data"];
    let resumed_id = resumed["id"].as_str().unwrap().to_string();
    assert_eq!(resumed["resumed_from_run_id"], first_id.as_str());
    assert_eq!(resumed["checkpoint"]["source_run_id"], first_id.as_str());
    assert_eq!(
        resumed["checkpoint"]["last_completed_step"]["name"],
        "shell"
    );
    assert!(
        resumed["checkpoint"]["last_event_sequence"]
            .as_i64()
            .unwrap()
            >= 8
    );
    c.wait_terminal(&task_id, &resumed_id, RUN_TIMEOUT).await;
    assert_eq!(
        c.stdout(&task_id, &resumed_id).await,
        format!("2\nresumed from: {first_id}\n")
    );
    let events = c.events(&task_id, &resumed_id).await;
    let resumed_event = events
        .iter()
        .find(|e| e["type"] == "run.resumed_from_event")
        .unwrap();
    assert_eq!(resumed_event["data"]["reason"], "carry on");
    let (_, task) = c.get(&format!("/v1/tasks/{task_id}")).await;
    assert_eq!(
        task["data"]["budget_micros_usd"], 500,
        "resume never lowers the budget"
    );

    let (status, retried) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/{resumed_id}/retry"),
            json!({ "budget_micros_usd": 900 }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let retried_id = retried["data"]["id"].as_str().unwrap().to_string();
    c.wait_terminal(&task_id, &retried_id, RUN_TIMEOUT).await;
    assert_eq!(
        c.stdout(&task_id, &retried_id).await,
        "1\nresumed from: \n",
        "retry works in a fresh workspace"
    );
    let (_, task) = c.get(&format!("/v1/tasks/{task_id}")).await;
    assert_eq!(
        task["data"]["budget_micros_usd"], 900,
        "a higher budget raises it"
    );
}

#[tokio::test]
async fn resume_needs_a_finished_run_and_passes_the_approval_gate() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    let (task_id, run) = start(
        c,
        json!({ "execution_kind": "shell", "shell_command": "true" }),
    )
    .await;
    let run_id = run["id"].as_str().unwrap();
    let (status, body) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/{run_id}/resume"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    c.post(
        &format!("/v1/tasks/{task_id}/runs/{run_id}/cancel"),
        json!({}),
    )
    .await;
    let (status, resumed) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/{run_id}/resume"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(resumed["data"]["status"], "awaiting_approval");
    let (status, _) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/run_nope/resume"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/{run_id}/resume"),
            json!({ "budget_micros_usd": -1 }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[tokio::test]
async fn leases_are_listed_while_active_and_after_release() {
    let app = TestApp::start().await;
    let c = &app.client;
    let dir = tempfile::tempdir().unwrap();
    let (task_id, run) = start(
        c,
        json!({ "execution_kind": "shell", "shell_command": "while [ ! -f go ]; do sleep 0.05; done",
                "workspace_mode": "in_place", "working_directory": dir.path() }),
    )
    .await;
    let run_id = run["id"].as_str().unwrap().to_string();
    c.wait_status(&task_id, &run_id, "running", RUN_TIMEOUT)
        .await;
    let (status, active) = c.get("/v1/runtime/leases?status=active").await;
    assert_eq!(status, StatusCode::OK);
    let lease = &active["data"][0];
    assert_eq!(lease["ref_id"], run_id.as_str());
    assert_eq!(lease["status"], "active");
    assert_eq!(lease["fencing_token"], 1);
    assert!(lease["owner"].as_str().unwrap().starts_with("wrk_"));
    std::fs::write(dir.path().join("go"), "").unwrap();
    c.wait_terminal(&task_id, &run_id, RUN_TIMEOUT).await;
    let (_, released) = c.get("/v1/runtime/leases?status=released").await;
    let lease = &released["data"][0];
    assert_eq!(lease["ref_id"], run_id.as_str());
    assert_eq!(lease["outcome"], "acked");
    assert_eq!(lease["status"], "released");
    let (_, active) = c.get("/v1/runtime/leases").await;
    assert!(active["data"].as_array().unwrap().is_empty());
}
