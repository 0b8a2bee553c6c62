//! Approvals, resume and the audit trail, against a real Postgres with Keel in process.

use crate::support;

use std::time::Duration;

use crate::support::{Client, TestApp, shell};
use keel_client::{
    ApprovalPolicyRequest, ApprovalRecord, ApprovalStatus, EventType, GateDecision, GateDecisions,
    LeaseRecord, PolicySource, Resolution, RunRecord, RunStatus, TaskDraft, TaskStatus,
    TerminalCode, TransitionRecord,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

const RUN_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_POLICIES: &str = "shell_exec,git_exec,file_write";

/// Creates the task and starts it (201); returns the task id and the new run.
async fn start(client: &Client, draft: TaskDraft) -> (String, RunRecord) {
    let task = client.create_task(&draft).await;
    let (status, run) = client
        .post(&format!("/v1/tasks/{}/start", task.id), json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    (task.id, support::record(&run))
}

async fn approvals_of(client: &Client, task_id: &str) -> Vec<ApprovalRecord> {
    let approvals = client.api.list_task_approvals(task_id, None);
    let (status, approvals) = approvals.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{approvals:?}");
    approvals.data
}

/// The audit trail of `query` (raw: keel-client has no operation listing it).
async fn trail(client: &Client, query: &str) -> Vec<TransitionRecord> {
    let (status, body) = client.get(&format!("/v1/state-transitions?{query}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    support::page(&body).data
}

/// The queue leases of `query` (raw: keel-client has no operation listing them).
async fn leases(client: &Client, query: &str) -> Vec<LeaseRecord> {
    let (status, body) = client.get(&format!("/v1/runtime/leases{query}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    support::page(&body).data
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
    let (task_id, run) = start(c, shell("echo approved")).await;
    let run_id = run.id.as_str();
    assert_eq!(run.status, RunStatus::AwaitingApproval);
    let task = c.api.get_task(&task_id).await.unwrap().data;
    assert_eq!(task.status, TaskStatus::AwaitingApproval);
    assert_eq!(
        job_count(&app, run_id).await,
        0,
        "a gated run is not enqueued"
    );

    let approvals = approvals_of(c, &task_id).await;
    assert_eq!(approvals.len(), 1);
    let approval = &approvals[0];
    assert_eq!(approval.kind, "shell_command");
    assert_eq!(approval.status, ApprovalStatus::Pending);
    assert_eq!(approval.action_summary[1], "  echo approved");
    assert!(!approval.action_summary_incomplete);
    let approval_id = approval.id.as_str();
    let one = c.api.get_approval(&task_id, approval_id);
    let (status, one) = one.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one.data.id, approval.id);
    let inbox = c.api.list_approvals(Some("pending")).await.unwrap().data;
    assert_eq!(inbox[0].id, approval.id);

    let (status, resolved) = resolve(c, &task_id, approval_id, "approve").await;
    assert_eq!(status, StatusCode::OK, "{resolved}");
    let resolved: Resolution = support::record(&resolved);
    assert_eq!(resolved.approval.status, ApprovalStatus::Approved);
    assert_eq!(
        resolved.approval.decision_note.as_deref(),
        Some("looked fine")
    );
    assert_eq!(resolved.run.status, RunStatus::Queued);
    let run = c.wait_terminal(&task_id, run_id, RUN_TIMEOUT).await;
    assert_eq!(run.status, RunStatus::Completed);

    let types: Vec<String> = c
        .events(&task_id, run_id)
        .await
        .iter()
        .map(|e| e.event_type.to_string())
        .collect();
    assert_eq!(
        &types[..6],
        [
            "run.created",
            "task.updated",
            "approval.requested",
            "approval.resolved",
            "task.updated",
            "run.queued"
        ]
    );
    let inbox = c.api.list_approvals(Some("pending")).await.unwrap().data;
    assert_eq!(inbox.len(), 0);

    // Every transition of the run's life, in order, with who made it.
    let run_trail = trail(c, &format!("entity_type=run&entity_id={run_id}")).await;
    let steps: Vec<(Option<&str>, &str, &str)> = run_trail
        .iter()
        .map(|t| {
            (
                t.from_status.as_deref(),
                t.to_status.as_str(),
                t.actor.as_str(),
            )
        })
        .collect();
    assert_eq!(steps.len(), 4, "{run_trail:?}");
    assert_eq!((steps[0].0, steps[0].1), (None, "awaiting_approval"));
    assert_eq!(
        (steps[1].0, steps[1].1),
        (Some("awaiting_approval"), "queued")
    );
    assert_eq!((steps[2].0, steps[2].1), (Some("queued"), "running"));
    assert_eq!((steps[3].0, steps[3].1), (Some("running"), "completed"));
    assert_eq!(steps[0].2, "local");
    assert_eq!(steps[1].2, "local");
    assert!(steps[2].2.starts_with("worker:wrk_") && steps[3].2 == steps[2].2);
    let task_trail = trail(c, &format!("entity_type=task&entity_id={task_id}")).await;
    let task_states: Vec<&str> = task_trail.iter().map(|t| t.to_status.as_str()).collect();
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
    let query = format!("entity_type=approval&entity_id={approval_id}");
    let approval_trail = trail(c, &query).await;
    let approval_states: Vec<&str> = approval_trail
        .iter()
        .map(|t| t.to_status.as_str())
        .collect();
    assert_eq!(approval_states, ["pending", "approved"]);
}

#[tokio::test]
async fn rejecting_cancels_the_run_and_a_second_resolve_conflicts() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    let (task_id, run) = start(c, shell("true")).await;
    let approval_id = approvals_of(c, &task_id).await[0].id.clone();
    let (status, body) = resolve(c, &task_id, &approval_id, "reject").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let run = c.run(&task_id, &run.id).await;
    assert_eq!(run.status, RunStatus::Cancelled);
    assert_eq!(run.last_error.as_deref(), Some("approval rejected"));
    assert_eq!(run.terminal_code, Some(TerminalCode::ApprovalRejected));
    let task = c.api.get_task(&task_id).await.unwrap().data;
    assert_eq!(task.status, TaskStatus::Cancelled);
    for decision in ["approve", "reject"] {
        let (status, body) = resolve(c, &task_id, &approval_id, decision).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"]["type"], "conflict");
        // What to do instead, by the command that does it.
        let next = body["error"]["operator_action"].as_str().unwrap();
        assert!(
            next.contains(&format!("keel approvals show {approval_id}")),
            "{body}"
        );
    }
}

#[tokio::test]
async fn concurrent_resolutions_have_exactly_one_winner() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    let (task_id, run) = start(c, shell("true")).await;
    let approval_id = approvals_of(c, &task_id).await[0].id.clone();
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
        let (task_id, run) = start(c, shell("sleep 60")).await;
        let run_id = run.id;
        let approval_id = approvals_of(c, &task_id).await[0].id.clone();
        let cancel = {
            let (c, path) = (
                c.clone(),
                format!("/v1/tasks/{task_id}/runs/{run_id}/cancel"),
            );
            tokio::spawn(async move { c.post_empty(&path).await })
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
        assert_eq!(
            run.status,
            RunStatus::Cancelled,
            "cancel always ends the run"
        );
        let approval = &approvals_of(c, &task_id).await[0];
        let expected = if approved.0 == StatusCode::OK {
            ApprovalStatus::Approved
        } else {
            ApprovalStatus::Cancelled
        };
        assert_eq!(approval.status, expected);
        if expected == ApprovalStatus::Cancelled {
            assert_eq!(approval.resolved_by.as_deref(), Some("system"));
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
    let (task_id, _) = start(c, shell("true")).await;
    let approval_id = approvals_of(c, &task_id).await[0].id.clone();
    sqlx::query("UPDATE approvals SET expires_at = now() - interval '1 second'")
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(
        approvals_of(c, &task_id).await[0].status,
        ApprovalStatus::Expired
    );
    let inbox = c.api.list_approvals(Some("pending")).await.unwrap().data;
    assert!(inbox.is_empty());
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
    let clone = TaskDraft {
        execution_kind: Some("git".into()),
        git_command: Some("clone https://example.invalid/repo.git".into()),
        ..TaskDraft::default()
    };
    let (task_id, run) = start(c, clone).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval);
    let mut kinds: Vec<String> = approvals_of(c, &task_id)
        .await
        .into_iter()
        .map(|a| a.kind)
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["git_exec", "network_egress"]);
    // Approving one of two gates leaves the run waiting.
    let approvals = approvals_of(c, &task_id).await;
    let (_, first) = resolve(c, &task_id, &approvals[0].id, "approve").await;
    let first: Resolution = support::record(&first);
    assert_eq!(first.run.status, RunStatus::AwaitingApproval);
    let (_, second) = resolve(c, &task_id, &approvals[1].id, "approve").await;
    let second: Resolution = support::record(&second);
    assert_eq!(second.run.status, RunStatus::Queued);

    let write = TaskDraft {
        execution_kind: Some("file".into()),
        file_path: Some("a".into()),
        file_operation: Some("write".into()),
        file_content: Some("very private contents".into()),
        ..TaskDraft::default()
    };
    let file = start(c, write).await;
    let approval = &approvals_of(c, &file.0).await[0];
    assert_eq!(approval.kind, "file_write");
    let summary = serde_json::to_string(&approval.action_summary).unwrap();
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
    let (task_id, _) = start(c, shell(&command)).await;
    let approval = &approvals_of(c, &task_id).await[0];
    let lines = &approval.action_summary;
    assert!(lines.len() <= 16);
    assert!(lines.iter().all(|l| l.len() <= 512));
    assert!(lines.iter().map(|l| l.len()).sum::<usize>() <= 4096);
    assert!(approval.action_summary_incomplete);
    let text = serde_json::to_string(&approval.action_summary).unwrap();
    assert!(
        !text.contains("sk-live") && !text.contains("p4ss"),
        "{text}"
    );
    let events = c
        .feed_when("/v1/events?event_type=approval.requested", |e| {
            !e.is_empty()
        })
        .await;
    assert!(!serde_json::to_string(&events).unwrap().contains("sk-live"));
}

#[tokio::test]
async fn resolve_refuses_bad_input() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    let (task_id, _) = start(c, shell("true")).await;
    let approval_id = approvals_of(c, &task_id).await[0].id.clone();
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
    let budgeted = TaskDraft {
        budget_micros_usd: Some(500),
        ..shell(counter)
    };
    let (task_id, first) = start(c, budgeted).await;
    let first_id = first.id;
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
    let resumed: RunRecord = support::record(&resumed);
    let resumed_id = resumed.id.clone();
    assert_eq!(resumed.resumed_from_run_id.as_ref(), Some(&first_id));
    let checkpoint = resumed.checkpoint.unwrap_or_default();
    assert_eq!(checkpoint["source_run_id"], first_id.as_str());
    assert_eq!(checkpoint["last_completed_step"]["name"], "shell");
    assert!(checkpoint["last_event_sequence"].as_i64().unwrap() >= 8);
    c.wait_terminal(&task_id, &resumed_id, RUN_TIMEOUT).await;
    assert_eq!(
        c.stdout(&task_id, &resumed_id).await,
        format!("2\nresumed from: {first_id}\n")
    );
    let events = c.events(&task_id, &resumed_id).await;
    let resumed_event = events
        .iter()
        .find(|e| e.event_type == EventType::RunResumedFromEvent)
        .unwrap();
    assert_eq!(resumed_event.data["reason"], "carry on");
    let task = c.api.get_task(&task_id).await.unwrap().data;
    assert_eq!(
        task.budget_micros_usd, 500,
        "resume never lowers the budget"
    );

    let (status, retried) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/{resumed_id}/retry"),
            json!({ "budget_micros_usd": 900 }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let retried_id = support::record::<RunRecord>(&retried).id;
    c.wait_terminal(&task_id, &retried_id, RUN_TIMEOUT).await;
    assert_eq!(
        c.stdout(&task_id, &retried_id).await,
        "1\nresumed from: \n",
        "retry works in a fresh workspace"
    );
    let task = c.api.get_task(&task_id).await.unwrap().data;
    assert_eq!(task.budget_micros_usd, 900, "a higher budget raises it");
}

#[tokio::test]
async fn resume_needs_a_finished_run_and_passes_the_approval_gate() {
    let app = TestApp::with_approvals(DEFAULT_POLICIES).await;
    let c = &app.client;
    let (task_id, run) = start(c, shell("true")).await;
    let run_id = run.id.as_str();
    let (status, body) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/{run_id}/resume"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    c.api.cancel_run(&task_id, run_id).await.unwrap();
    let (status, resumed) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/{run_id}/resume"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        support::record::<RunRecord>(&resumed).status,
        RunStatus::AwaitingApproval
    );
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
    let waiting = support::in_place(dir.path(), "while [ ! -f go ]; do sleep 0.05; done");
    let (task_id, run) = start(c, waiting).await;
    let run_id = run.id;
    c.wait_status(&task_id, &run_id, RunStatus::Running, RUN_TIMEOUT)
        .await;
    let active = leases(c, "?status=active").await;
    let lease = &active[0];
    assert_eq!(lease.ref_id, run_id);
    assert_eq!(lease.status, "active");
    assert_eq!(lease.fencing_token, 1);
    assert!(lease.owner.starts_with("wrk_"));
    std::fs::write(dir.path().join("go"), "").unwrap();
    c.wait_terminal(&task_id, &run_id, RUN_TIMEOUT).await;
    let released = leases(c, "?status=released").await;
    let lease = &released[0];
    assert_eq!(lease.ref_id, run_id);
    assert_eq!(lease.outcome.as_deref(), Some("acked"));
    assert_eq!(lease.status, "released");
    let active = leases(c, "").await;
    assert!(active.is_empty());
}

/// Every gate named, `shell_exec` as given, the rest allowed.
fn policy_request(shell_exec: GateDecision, write_paths: Option<&[&str]>) -> ApprovalPolicyRequest {
    let allow = GateDecision::Allow;
    ApprovalPolicyRequest {
        gates: GateDecisions {
            shell_exec,
            git_exec: allow,
            file_write: allow,
            network_egress: allow,
            read_file: allow,
            all_tools: allow,
        },
        mcp_servers: [("github".to_string(), GateDecision::Deny)].into(),
        allowed_write_paths: write_paths.map(|p| p.iter().map(|p| p.to_string()).collect()),
    }
}

fn file_task(path: &str) -> TaskDraft {
    TaskDraft {
        execution_kind: Some("file".into()),
        file_path: Some(path.into()),
        file_operation: Some("write".into()),
        file_content: Some("written".into()),
        ..TaskDraft::default()
    }
}

/// An operator's workspace policy applies to the next admission, without a restart: a
/// gate it denies refuses the start (403), one it asks for waits for an approval, a file
/// task outside its write paths is refused; removing it brings the process setting back.
/// Every change is in the audit trail with its actor and what it replaced.
#[tokio::test]
async fn a_workspace_policy_applies_to_the_next_admission_and_every_change_is_audited() {
    let app = TestApp::with_approvals("git_exec").await;
    let (c, api) = (&app.client, &app.client.api);
    let shown = api.get_policy("default").send().await.unwrap().data;
    assert_eq!(shown.source, PolicySource::Default);
    assert_eq!(shown.gates.git_exec, GateDecision::Ask);
    assert_eq!(shown.gates.shell_exec, GateDecision::Allow);

    let deny = policy_request(GateDecision::Deny, Some(&["src"]));
    let set = api.put_policy("default", &deny).send().await.unwrap().data;
    assert_eq!(set.source, PolicySource::Workspace);
    assert_eq!(set.updated_by.as_deref(), Some("local"));
    assert_eq!(set.allowed_write_paths, Some(vec!["src".to_string()]));
    let task = c.create_task(&shell("echo denied")).await;
    let (status, body) = c
        .post(&format!("/v1/tasks/{}/start", task.id), json!({}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["type"], "forbidden");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("denies shell_exec"), "{body}");
    // It names the command that lifts it, then the route.
    assert!(
        message.contains("`keel workspace set-policy WORKSPACE_ID --gate shell_exec=ask`"),
        "{body}"
    );
    let outside = c.create_task(&file_task("README.md")).await;
    let (status, body) = c
        .post(&format!("/v1/tasks/{}/start", outside.id), json!({}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("beneath: src"),
        "{body}"
    );
    let (task_id, run) = start(c, file_task("src/notes.txt")).await;
    let run = c.wait_terminal(&task_id, &run.id, RUN_TIMEOUT).await;
    assert_eq!(
        run.status,
        RunStatus::Completed,
        "inside the write paths: {run:?}"
    );

    let ask = policy_request(GateDecision::Ask, None);
    api.put_policy("default", &ask).send().await.unwrap();
    let (status, body) = c
        .post(&format!("/v1/tasks/{}/start", task.id), json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let waiting: RunRecord = support::record(&body);
    assert_eq!(waiting.status, RunStatus::AwaitingApproval);
    assert_eq!(approvals_of(c, &task.id).await[0].kind, "shell_command");
    let cancel = format!("/v1/tasks/{}/runs/{}/cancel", task.id, waiting.id);
    assert_eq!(c.post_empty(&cancel).await.0, StatusCode::OK);

    let reset = api.delete_policy("default").send().await.unwrap().data;
    assert_eq!(reset.source, PolicySource::Default);
    let (task_id, run) = start(c, shell("echo allowed again")).await;
    assert_eq!(
        run.status,
        RunStatus::Queued,
        "the process setting lets shell tasks run"
    );
    c.wait_terminal(&task_id, &run.id, RUN_TIMEOUT).await;

    let changes = trail(c, "entity_type=approval_policy").await;
    let summary: Vec<(&str, &str, &str)> = changes
        .iter()
        .map(|t| {
            (
                t.from_status.as_deref().unwrap(),
                t.to_status.as_str(),
                t.actor.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "git_exec",
                "shell_exec=deny,mcp:github=deny,write_paths=[src]",
                "local"
            ),
            (
                "shell_exec=deny,mcp:github=deny,write_paths=[src]",
                "shell_exec,mcp:github=deny",
                "local"
            ),
            ("shell_exec,mcp:github=deny", "git_exec", "local"),
        ]
    );
    assert!(changes.iter().all(|t| t.entity_id == "default"));
}

/// A policy is checked as the document states it: bad paths and server names are 422,
/// and a request that leaves a gate out is refused.
#[tokio::test]
async fn a_workspace_policy_refuses_what_it_cannot_apply() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let mut body = serde_json::to_value(policy_request(GateDecision::Ask, None)).unwrap();
    let path = "/v1/workspaces/default/approval-policy";
    for (field, value) in [
        ("allowed_write_paths", json!(["../up"])),
        ("allowed_write_paths", json!(["/etc"])),
        ("mcp_servers", json!({ "Bad__Name": "deny" })),
    ] {
        let mut bad = body.clone();
        bad[field] = value;
        let put = c.http.put(format!("{}{path}", c.base)).json(&bad);
        let (status, answer) = c.send(put).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{field}: {answer}"
        );
    }
    body["gates"].as_object_mut().unwrap().remove("read_file");
    let (status, answer) = c
        .send(c.http.put(format!("{}{path}", c.base)).json(&body))
        .await;
    assert!(status.is_client_error(), "a gate left out: {answer}");
    let (status, _) = c.get("/v1/workspaces/default/approval-policy").await;
    assert_eq!(status, StatusCode::OK);
}
