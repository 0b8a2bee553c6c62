//! Approval-gated tracker actions against real `keel api` and `keel worker` processes and
//! local servers speaking GitHub's REST and Linear's GraphQL: nothing is sent before the
//! approval, a target that changed since the proposal is refused, a fresh one is sent
//! exactly once (even when the worker dies after the call, before recording it), and the
//! tracker token is in no row, log, event or artifact.

use crate::support;
use crate::support::tracker_actions;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{Client, KeelProcess, rows_containing, wait_for};
use keel_client::{
    ActionListFilter, ActionRecord, ActionStatus, ApprovalRecord, ApprovalStatus, ItemRecord,
    PollSummary, Proposed, Resolution, RunStatus, SourceRecord,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tracker_actions::{Written, mount_list, requests};
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const CANARY: &str = "ghp_canary_act10n5";
const TOKEN_ENV: (&str, &str) = ("ACME_GITHUB_TOKEN", CANARY);
const LINEAR_CANARY: &str = "lin_api_canary_act10n5";
const LINEAR_ENV: (&str, &str) = ("ACME_LINEAR_API_KEY", LINEAR_CANARY);
const T1: &str = "2026-11-30T09:00:00Z";
/// A lease no loaded machine runs out of between two heartbeats: only the tests about a
/// lost lease (a worker killed or cut off) give their doomed worker a short one.
const STEADY_LEASE_MS: u64 = 5_000;
const DOOMED_LEASE_MS: u64 = 1_000;

fn github_workflow(endpoint: &str) -> String {
    format!(
        "---
tracker:
  kind: github
  endpoint: {endpoint}
  repository: acme/widgets
  api_key: $ACME_GITHUB_TOKEN
task:
  execution_kind: shell
  shell_command: echo imported
---
Work on {{{{ issue.identifier }}}}
"
    )
}

fn linear_workflow(endpoint: &str) -> String {
    format!(
        "---
tracker:
  kind: linear
  endpoint: {endpoint}
  project_slug: eng
  api_key: $ACME_LINEAR_API_KEY
actions:
  execute_on_approval: true
task:
  execution_kind: shell
  shell_command: echo imported
---
Work on {{{{ issue.identifier }}}}
"
    )
}

fn issue(number: u64, state: &str, updated_at: &str) -> Value {
    json!({ "id": 1000 + number, "number": number, "title": format!("issue {number}"),
            "state": state, "updated_at": updated_at, "labels": [] })
}

fn pull(number: u64, sha: &str) -> Value {
    json!({ "id": 2000 + number, "number": number, "title": format!("pull {number}"),
            "state": "open", "updated_at": T1, "head": { "sha": sha, "ref": "fix" } })
}

/// GitHub answering `at` with `body` to a request carrying the token.
async fn answer(github: &MockServer, verb: &str, at: &str, body: Value) {
    Mock::given(method(verb))
        .and(path(at))
        .and(header("authorization", format!("Bearer {CANARY}").as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .mount(github)
        .await;
}

/// A `keel api`, a source registered and polled once (its items claimed), and workers.
struct Tracked {
    dir: tempfile::TempDir,
    db_url: String,
    api: KeelProcess,
    client: Client,
    source_id: String,
    workers: Vec<KeelProcess>,
}

impl Tracked {
    async fn start(markdown: &str, env: (&str, &str), workers: &[&str]) -> Tracked {
        let dir = tempfile::tempdir().unwrap();
        let db_url = support::fresh_database().await;
        let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &[env]).await;
        let client = api.client.clone().unwrap();
        let body = json!({ "workflow_markdown": markdown });
        let (status, body) = client.post("/v1/external-work/sources", body).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let source_id = support::record::<SourceRecord>(&body).id;
        let poll = format!("/v1/external-work/sources/{source_id}/poll");
        let (status, body) = client.post(&poll, json!({})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let summary: PollSummary = support::record(&body);
        assert_eq!(summary.error_code, None, "{body}");
        let mut tracked = Tracked {
            dir,
            db_url,
            api,
            client,
            source_id,
            workers: Vec::new(),
        };
        for name in workers {
            tracked.worker(name, env);
        }
        tracked
    }

    fn worker(&mut self, name: &str, env: (&str, &str)) {
        let db_url = self.db_url.clone();
        self.worker_through(&db_url, name, env, STEADY_LEASE_MS);
    }

    /// A worker reaching the database at `db_url` (a proxy in front of it, say).
    fn worker_through(&mut self, db_url: &str, name: &str, env: (&str, &str), lease_ms: u64) {
        let data = self.dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        let dir = self.dir.path();
        let worker = support::spawn_worker_with_env(db_url, dir, name, lease_ms, &data, &[env]);
        self.workers.push(worker);
    }

    /// The item of `identifier` that has its task.
    async fn item(&self, identifier: &str) -> ItemRecord {
        let items = self.client.api.list_items(&self.source_id);
        let (status, items) = items.send_with_status().await.unwrap();
        assert_eq!(status, StatusCode::OK, "{items:?}");
        let items = items.data;
        items
            .iter()
            .find(|i| i.identifier == identifier && i.task_id.is_some())
            .unwrap_or_else(|| panic!("no claimed item {identifier}: {items:?}"))
            .clone()
    }

    /// Proposes `body` on the item (raw: bad proposals are refused).
    async fn propose(&self, item_id: &str, body: Value) -> (StatusCode, Value) {
        let at = format!("/v1/external-work/items/{item_id}/actions");
        self.client.post(&at, body).await
    }

    /// Proposes, expecting 201; returns the action and its approval.
    async fn proposed(&self, item: &ItemRecord, body: Value) -> (ActionRecord, ApprovalRecord) {
        let (status, body) = self.propose(&item.id, body).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let Proposed { action, approval } = support::record(&body);
        (action, approval)
    }

    /// Proposes and approves a comment on #7; returns the action once its POST reached
    /// GitHub's `comments` list.
    async fn comment_reaching(&self, comments: &Written) -> ActionRecord {
        let item = self.item("acme/widgets#7").await;
        let (action, approval) = self
            .proposed(&item, json!({ "kind": "comment", "body": "Once." }))
            .await;
        self.approve_and_execute(&approval).await;
        wait_for(
            Duration::from_secs(30),
            "the call to reach GitHub",
            || async { (!comments.all().is_empty()).then_some(()) },
        )
        .await;
        action
    }

    /// Approves the action's approval, then executes the action.
    async fn approve_and_execute(&self, approval: &ApprovalRecord) -> ActionRecord {
        let (status, body) = self.resolve(approval, "approve").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let action_id = approval.external_action_id.as_deref().unwrap();
        let (status, body) = self.execute(action_id).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        support::record(&body)
    }

    async fn execute(&self, action_id: &str) -> (StatusCode, Value) {
        let at = format!("/v1/external-work/actions/{action_id}/execute");
        self.client.post_empty(&at).await
    }

    async fn cancel(&self, action_id: &str, reason: &str) -> (StatusCode, Value) {
        let at = format!("/v1/external-work/actions/{action_id}/cancel");
        self.client.post(&at, json!({ "reason": reason })).await
    }

    async fn resolve(&self, approval: &ApprovalRecord, decision: &str) -> (StatusCode, Value) {
        let at = format!(
            "/v1/tasks/{}/approvals/{}/resolve",
            approval.task_id, approval.id
        );
        self.client.post(&at, json!({ "decision": decision })).await
    }

    async fn action(&self, id: &str) -> ActionRecord {
        let action = self.client.api.get_action(id).send_with_status().await;
        let (status, action) = action.unwrap();
        assert_eq!(status, StatusCode::OK, "{action:?}");
        action.data
    }

    /// Waits up to 30 s for the action to reach `status`; on timeout, says where it stood
    /// and what the workers logged last.
    async fn wait_action(&self, action: &ActionRecord, status: ActionStatus) -> ActionRecord {
        let id = action.id.as_str();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let current = self.action(id).await;
            if current.status == status {
                return current;
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .workers
                    .iter()
                    .map(|w| last_lines(&w.log_text(), 40))
                    .collect();
                panic!(
                    "action {id} still {} after 30 s waiting for {status}: {current:?}\nworkers' last lines:\n{}",
                    current.status,
                    logs.join("\n---\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The evidence artifact an action's end left on its run.
    async fn evidence(&self, action: &ActionRecord) -> Value {
        let artifact = action.artifact_id.as_deref().unwrap();
        let content = self
            .client
            .api
            .artifact_content(&action.task_id, &action.run_id, artifact);
        let (status, body) = content.raw_with_status().await.unwrap();
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }

    /// The canary is in no row, and in no process's log.
    async fn assert_no_canary(mut self, canary: &str) {
        assert_eq!(
            rows_containing(&self.db_url, canary).await,
            Vec::<String>::new()
        );
        for mut worker in self.workers.drain(..) {
            worker.terminate(Duration::from_secs(10));
            assert!(
                !worker.log_text().contains(canary),
                "the token is in a worker's log"
            );
        }
        drop(self.api);
        let log = std::fs::read_to_string(self.dir.path().join("api.log")).unwrap();
        assert!(!log.contains(canary), "the token is in the API log");
    }
}

/// The answer a sent action kept, checked: the POST's 201; or, where a worker took the
/// action over after its lease was lost mid-send (a loaded machine), the 200 of the GET of
/// `list` that found the entry by its marker. Either way, the one entry `written` holds.
async fn assert_answered_once(
    sent: &ActionRecord,
    written: &Written,
    github: &MockServer,
    list: &str,
) -> Value {
    let answered = response(sent)["http_status"].clone();
    let found_again = answered == 200 && !requests(github, "GET", list).await.is_empty();
    assert!(answered == 201 || found_again, "{sent:?}");
    assert_eq!(written.all().len(), 1, "{sent:?}");
    assert_eq!(response(sent)["id"], written.all()[0]["id"], "{sent:?}");
    answered
}

/// The tracker's answer an action keeps (null before it has one).
fn response(action: &ActionRecord) -> Value {
    action.response.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_fresh_comment_is_sent_once_after_approval_and_changed_targets_are_refused() {
    let github = MockServer::start().await;
    let issues = json!([issue(7, "open", T1), issue(9, "open", T1)]);
    answer(&github, "GET", "/repos/acme/widgets/issues", issues).await;
    answer(
        &github,
        "GET",
        "/repos/acme/widgets/pulls",
        json!([pull(8, "aaa")]),
    )
    .await;
    // Asked again at the approval: #7 as it was, #9 updated since, #8 with a new head.
    answer(
        &github,
        "GET",
        "/repos/acme/widgets/issues/7",
        issue(7, "open", T1),
    )
    .await;
    let updated = issue(9, "open", "2026-11-30T10:00:00Z");
    answer(&github, "GET", "/repos/acme/widgets/issues/9", updated).await;
    answer(
        &github,
        "GET",
        "/repos/acme/widgets/pulls/8",
        pull(8, "bbb"),
    )
    .await;
    let seven = "/repos/acme/widgets/issues/7/comments";
    let nine = "/repos/acme/widgets/issues/9/comments";
    let reviews = "/repos/acme/widgets/pulls/8/reviews";
    let written = mount_list(&github, seven, Duration::ZERO).await;
    for list in [nine, reviews] {
        mount_list(&github, list, Duration::ZERO).await;
    }
    let app = Tracked::start(&github_workflow(&github.uri()), TOKEN_ENV, &["worker"]).await;

    let item = app.item("acme/widgets#7").await;
    let (action, approval) = app
        .proposed(
            &item,
            json!({ "kind": "comment", "body": "Looks fixed.\nThanks!" }),
        )
        .await;
    let id = action.id.as_str();
    assert_eq!(action.status, ActionStatus::PendingApproval, "{action:?}");
    assert_eq!(Some(&action.task_id), item.task_id.as_ref());
    assert_eq!(Some(&action.run_id), item.run_id.as_ref());
    assert_eq!(action.target["updated_at"], T1, "{action:?}");
    assert_eq!(approval.kind, "external_action", "{approval:?}");
    assert_eq!(approval.status, ApprovalStatus::Pending);
    assert_eq!(approval.external_action_id.as_deref(), Some(id));
    let summary: Vec<&str> = approval.action_summary.iter().map(String::as_str).collect();
    assert_eq!(
        summary[0],
        format!("POST {}{seven}", github.uri()),
        "{summary:?}"
    );
    assert!(
        summary.contains(&"  Looks fixed.") && summary.contains(&"  Thanks!"),
        "{summary:?}"
    );
    assert!(
        summary
            .iter()
            .any(|l| l.contains(&format!("<!-- keel-action:{id} -->")))
    );
    let task_id = item.task_id.as_deref().unwrap();
    let listed = app.client.api.list_task_approvals(task_id, Some("pending"));
    let listed = listed.await.unwrap().data;
    assert_eq!(listed[0].id, approval.id, "{listed:?}");

    let stale_item = app.item("acme/widgets#9").await;
    let (stale, stale_approval) = app
        .proposed(&stale_item, json!({ "kind": "comment", "body": "Done?" }))
        .await;
    let pull_item = app.item("acme/widgets#8").await;
    let review = json!({ "kind": "review", "event": "COMMENT", "body": "One nit." });
    let (moved, moved_approval) = app.proposed(&pull_item, review).await;
    assert_eq!(moved.target["head_sha"], "aaa", "{moved:?}");
    assert!(
        github
            .received_requests()
            .await
            .unwrap()
            .iter()
            .all(|r| r.method.as_str() == "GET")
    );

    for approval in [&approval, &stale_approval, &moved_approval] {
        let (status, body) = app.resolve(approval, "approve").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let resolution: Resolution = support::record(&body);
        assert_eq!(
            resolution.approval.status,
            ApprovalStatus::Approved,
            "{body}"
        );
    }
    // Approved, each waits for its execute (seed 000 keeps the two apart): nothing is sent.
    let waiting = app.client.api.list_actions(&ActionListFilter {
        status: Some(ActionStatus::Approved),
        ..ActionListFilter::default()
    });
    let waiting = waiting.await.unwrap().data;
    let ids: Vec<&str> = waiting.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, [id, stale.id.as_str(), moved.id.as_str()]);
    assert!(
        waiting.iter().all(|a| a.execute_requested_at.is_none()),
        "{waiting:?}"
    );
    let only_gets = || async {
        let received = github.received_requests().await.unwrap();
        received.iter().all(|r| r.method.as_str() == "GET")
    };
    assert!(
        only_gets().await,
        "an approved action was sent before its execute"
    );
    for action in [&action, &stale, &moved] {
        let (status, body) = app.execute(&action.id).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let executed: ActionRecord = support::record(&body);
        assert!(executed.execute_requested_at.is_some(), "{body}");
    }
    // Asked again: the same action, its job queued once.
    let (status, body) = app.execute(id).await;
    assert!(
        status == StatusCode::OK || body["error"]["type"] == "action_not_executable",
        "{status} {body}"
    );
    let sent = app.wait_action(&action, ActionStatus::Sent).await;
    let stale = app.wait_action(&stale, ActionStatus::StaleTarget).await;
    let moved = app.wait_action(&moved, ActionStatus::StaleTarget).await;

    // Exactly one call, with the marker, carrying the token; nothing to the changed ones.
    let posts = requests(&github, "POST", seven).await;
    assert_eq!(posts.len(), 1, "{posts:?}");
    let body: Value = serde_json::from_slice(&posts[0].body).unwrap();
    assert_eq!(
        body,
        json!({ "body": format!("Looks fixed.\nThanks!\n\n<!-- keel-action:{id} -->") })
    );
    assert_eq!(
        posts[0]
            .headers
            .get("authorization")
            .unwrap()
            .to_str()
            .unwrap(),
        format!("Bearer {CANARY}")
    );
    assert_eq!(written.all().len(), 1);
    assert!(requests(&github, "POST", nine).await.is_empty());
    assert!(requests(&github, "POST", reviews).await.is_empty());

    let answered = assert_answered_once(&sent, &written, &github, seven).await;
    assert!(
        sent.finished_at.is_some() && sent.sending_at.is_some(),
        "{sent:?}"
    );
    let evidence = app.evidence(&sent).await;
    assert_eq!(evidence["evidence"]["outcome"], "sent", "{evidence}");
    assert_eq!(
        evidence["evidence"]["answers"][0]["http_status"], answered,
        "{evidence}"
    );
    assert_eq!(
        stale.last_error_code.as_deref(),
        Some("stale_target"),
        "{stale:?}"
    );
    let reason = stale.last_error.as_deref().unwrap();
    assert!(
        reason.contains("updated at 2026-11-30T10:00:00Z (was 2026-11-30T09:00:00Z)"),
        "{reason}"
    );
    let evidence = app.evidence(&stale).await;
    assert_eq!(
        evidence["evidence"]["target_now"]["updated_at"],
        "2026-11-30T10:00:00Z"
    );
    let reason = moved.last_error.as_deref().unwrap();
    assert!(reason.contains("head is now bbb (was aaa)"), "{reason}");

    let page = app.client.api.list_item_actions(&item.id);
    let (status, page) = page.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{page:?}");
    assert_eq!(page.data.len(), 1, "{page:?}");
    assert_eq!(page.data[0].approval_id.as_ref(), Some(&approval.id));
    let (status, body) = app.resolve(&approval, "reject").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let health = app.client.api.source_status(&app.source_id);
    let (status, health) = health.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{health:?}");
    let counts: std::collections::BTreeMap<String, i64> =
        [("sent", 1), ("stale_target", 2), ("total", 3)]
            .map(|(status, n)| (status.to_string(), n))
            .into();
    assert_eq!(health.data.actions, counts, "{health:?}");
    // Sent or stale now, none may be executed or cancelled again.
    for action in [&sent, &stale] {
        let (status, body) = app.execute(&action.id).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"]["type"], "action_not_executable", "{body}");
        let (status, body) = app.cancel(&action.id, "too late").await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"]["type"], "action_not_cancellable", "{body}");
    }
    support::contracts::assert_github_conforms(&github.received_requests().await.unwrap());
    // The approval never held the run: it ran as any other.
    let run = app
        .client
        .wait_terminal(
            item.task_id.as_deref().unwrap(),
            item.run_id.as_deref().unwrap(),
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    app.assert_no_canary(CANARY).await;
}

#[tokio::test]
async fn rejected_actions_send_nothing_labels_and_reviews_round_trip_and_bad_bodies_are_refused() {
    let github = MockServer::start().await;
    let issues = json!([issue(7, "open", T1), issue(5, "closed", T1)]);
    answer(&github, "GET", "/repos/acme/widgets/issues", issues).await;
    answer(
        &github,
        "GET",
        "/repos/acme/widgets/pulls",
        json!([pull(8, "aaa")]),
    )
    .await;
    answer(
        &github,
        "GET",
        "/repos/acme/widgets/issues/7",
        issue(7, "open", T1),
    )
    .await;
    answer(
        &github,
        "GET",
        "/repos/acme/widgets/pulls/8",
        pull(8, "aaa"),
    )
    .await;
    let labels = "/repos/acme/widgets/issues/7/labels";
    answer(&github, "POST", labels, json!([{ "name": "ready" }])).await;
    answer(&github, "DELETE", &format!("{labels}/triage"), json!([])).await;
    let comments = "/repos/acme/widgets/issues/7/comments";
    mount_list(&github, comments, Duration::ZERO).await;
    let reviews = "/repos/acme/widgets/pulls/8/reviews";
    let written = mount_list(&github, reviews, Duration::ZERO).await;
    let app = Tracked::start(&github_workflow(&github.uri()), TOKEN_ENV, &["worker"]).await;
    let (seven, eight) = (
        app.item("acme/widgets#7").await,
        app.item("acme/widgets#8").await,
    );

    let (rejected, approval) = app
        .proposed(&seven, json!({ "kind": "comment", "body": "No." }))
        .await;
    let (status, body) = app.resolve(&approval, "reject").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let rejected = app.action(&rejected.id).await;
    assert_eq!(rejected.status, ActionStatus::Rejected, "{rejected:?}");
    assert!(rejected.finished_at.is_some());

    let change = json!({ "kind": "labels", "add": ["ready"], "remove": ["triage"] });
    let (label_action, approval) = app.proposed(&seven, change).await;
    let summary = serde_json::to_string(&approval.action_summary).unwrap();
    assert!(
        summary.contains(&format!("DELETE {}{labels}/triage", github.uri())),
        "{summary}"
    );
    app.approve_and_execute(&approval).await;
    let review = json!({ "kind": "review", "event": "REQUEST_CHANGES", "body": "Add a test." });
    let (review_action, approval) = app.proposed(&eight, review).await;
    app.approve_and_execute(&approval).await;
    app.wait_action(&label_action, ActionStatus::Sent).await;
    let sent_review = app.wait_action(&review_action, ActionStatus::Sent).await;

    assert!(
        requests(&github, "POST", comments).await.is_empty(),
        "the rejected one was sent"
    );
    // Labels carry no marker: an attempt that took over after a lease lost mid-send (a
    // loaded machine) sends them again, which repeats no effect (adding a label it has is
    // a no-op; removing one already gone answers 404, which counts as removed). Never a
    // third time.
    let added = requests(&github, "POST", labels).await;
    assert!(
        (1..=2).contains(&added.len()),
        "{} label POSTs",
        added.len()
    );
    for post in &added {
        let body: Value = serde_json::from_slice(&post.body).unwrap();
        assert_eq!(body, json!({ "labels": ["ready"] }));
    }
    let removed = requests(&github, "DELETE", &format!("{labels}/triage")).await;
    assert!((1..=added.len()).contains(&removed.len()), "{removed:?}");
    let posted = requests(&github, "POST", reviews).await;
    assert_eq!(posted.len(), 1);
    let body: Value = serde_json::from_slice(&posted[0].body).unwrap();
    let id = review_action.id.as_str();
    assert_eq!(
        body,
        json!({ "event": "REQUEST_CHANGES", "commit_id": "aaa",
                "body": format!("Add a test.\n\n<!-- keel-action:{id} -->") })
    );
    assert_eq!(written.all()[0]["state"], "REQUEST_CHANGES");
    assert_answered_once(&sent_review, &written, &github, reviews).await;

    // Bad proposals: 4xx with the envelope, and nothing recorded.
    let big = "x".repeat(64 * 1024 + 1);
    let many: Vec<String> = (0..21).map(|i| format!("l{i}")).collect();
    let cases = [
        (
            json!({ "body": "no kind" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            json!({ "kind": "merge" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            json!({ "kind": "comment" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            json!({ "kind": "comment", "body": big }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            json!({ "kind": "comment", "body": "x", "add": ["a"] }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            json!({ "kind": "labels", "add": many }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            json!({ "kind": "labels", "add": ["a\nb"] }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            json!({ "kind": "review", "event": "MERGE", "body": "x" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            json!({ "kind": "review", "event": "APPROVE" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unsupported_action",
        ),
        (
            json!({ "kind": "comment", "body": "x", "run_id": "run_nope" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            json!({ "kind": "comment", "body": 7 }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
        (
            json!({ "kind": "comment", "body": "x", "extra": 1 }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
    ];
    for (body, expected, kind) in cases {
        let (status, answer) = app.propose(&seven.id, body.clone()).await;
        assert_eq!(status, expected, "{body}: {answer}");
        assert_eq!(answer["error"]["type"], kind, "{body}: {answer}");
        assert!(answer["error"]["request_id"].is_string(), "{answer}");
    }
    // A closed item no task works on, and an unknown item.
    let items = app.client.api.list_items(&app.source_id).await.unwrap();
    let closed = items
        .data
        .iter()
        .find(|i| i.identifier == "acme/widgets#5")
        .unwrap();
    let (status, answer) = app
        .propose(&closed.id, json!({ "kind": "comment", "body": "x" }))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["error"]["type"], "item_not_claimed", "{answer}");
    let (status, answer) = app
        .propose("extitem_nope", json!({ "kind": "comment", "body": "x" }))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    let (status, _) = app.client.get("/v1/external-work/actions/xact_nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let page = app.client.api.list_item_actions(&seven.id);
    let page = page.query("limit", Some(2)).await.unwrap();
    assert!(!page.has_more, "two proposals on #7 only: {page:?}");
    assert_eq!(page.data.len(), 2, "{page:?}");
    app.assert_no_canary(CANARY).await;
}

/// One Linear issue's comments, as `commentCreate` makes them and the marked comments
/// query reads them back (each `comment-1`, as the test's single comment is).
#[derive(Clone, Default)]
struct LinearComments(Arc<Mutex<Vec<String>>>);

impl LinearComments {
    fn create(&self) -> impl wiremock::Respond + use<> {
        let comments = self.clone();
        move |request: &wiremock::Request| {
            let sent: Value = serde_json::from_slice(&request.body).unwrap();
            let body = sent["variables"]["body"].as_str().unwrap().to_string();
            comments.0.lock().unwrap().push(body);
            ResponseTemplate::new(200).set_body_json(json!({ "data": { "commentCreate": {
                "success": true, "comment": LinearComments::node(None) } } }))
        }
    }

    fn lookup(&self) -> impl wiremock::Respond + use<> {
        let comments = self.clone();
        move |_: &wiremock::Request| {
            let nodes: Vec<Value> = comments
                .0
                .lock()
                .unwrap()
                .iter()
                .map(|body| LinearComments::node(Some(body)))
                .collect();
            ResponseTemplate::new(200)
                .set_body_json(json!({ "data": { "issue": { "comments": { "nodes": nodes } } } }))
        }
    }

    fn node(body: Option<&str>) -> Value {
        let mut node =
            json!({ "id": "comment-1", "url": "https://linear.app/acme/issue/ENG-1#comment-1" });
        if let Some(body) = body {
            node["body"] = json!(body);
        }
        node
    }
}

#[tokio::test]
async fn a_linear_comment_goes_through_the_comment_create_mutation() {
    let linear = MockServer::start().await;
    let node = json!({ "id": "uuid-1", "identifier": "ENG-1", "title": "issue 1",
        "state": { "name": "Todo" }, "updatedAt": "2026-11-30T10:00:00.000Z",
        "labels": { "nodes": [] }, "inverseRelations": { "nodes": [] } });
    let page = |nodes: Value| {
        json!({ "data": { "issues": { "nodes": nodes,
        "pageInfo": { "hasNextPage": false, "endCursor": null } } } })
    };
    let graphql = |variables: Value, answer: Value| {
        Mock::given(method("POST"))
            .and(path("/graphql"))
            .and(header("authorization", LINEAR_CANARY))
            .and(body_partial_json(json!({ "variables": variables })))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer))
    };
    graphql(json!({ "projectSlug": "eng" }), page(json!([node.clone()])))
        .mount(&linear)
        .await;
    graphql(json!({ "ids": ["uuid-1"] }), page(json!([node])))
        .mount(&linear)
        .await;
    // As Linear keeps them: an attempt whose lease ran short around its call (a loaded
    // machine) leaves the action `sending`, and the next one looks for the marked comment
    // first: there once the first call made it, absent if that attempt stopped before.
    let comments = LinearComments::default();
    Mock::given(method("POST"))
        .and(path("/graphql"))
        .and(header("authorization", LINEAR_CANARY))
        .and(body_partial_json(
            json!({ "variables": { "issueId": "uuid-1" } }),
        ))
        .respond_with(comments.create())
        .mount(&linear)
        .await;
    Mock::given(method("POST"))
        .and(path("/graphql"))
        .and(header("authorization", LINEAR_CANARY))
        .and(body_partial_json(
            json!({ "variables": { "id": "uuid-1" } }),
        ))
        .respond_with(comments.lookup())
        .mount(&linear)
        .await;
    let endpoint = format!("{}/graphql", linear.uri());
    let app = Tracked::start(&linear_workflow(&endpoint), LINEAR_ENV, &["worker"]).await;
    let item = app.item("ENG-1").await;

    for (body, code) in [
        (
            json!({ "kind": "labels", "add": ["bug"] }),
            "unsupported_action",
        ),
        (
            json!({ "kind": "review", "event": "APPROVE" }),
            "unsupported_action",
        ),
    ] {
        let (status, answer) = app.propose(&item.id, body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        assert_eq!(answer["error"]["type"], code, "{answer}");
    }
    let (action, approval) = app
        .proposed(&item, json!({ "kind": "comment", "body": "On it." }))
        .await;
    assert_eq!(action.calls[0]["path"], "", "{action:?}");
    // The workflow executes on approval: no execute is asked for.
    app.resolve(&approval, "approve").await;
    let sent = app.wait_action(&action, ActionStatus::Sent).await;
    assert!(sent.execute_requested_at.is_some(), "{sent:?}");
    assert!(sent.execute_requested_by.is_some(), "{sent:?}");
    assert_eq!(response(&sent)["id"], "comment-1", "{sent:?}");

    let all = linear.received_requests().await.unwrap();
    let mutations: Vec<Value> = all
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap())
        .filter(|b| b["query"].as_str().unwrap().contains("commentCreate"))
        .collect();
    assert_eq!(mutations.len(), 1, "{mutations:?}");
    let id = action.id.as_str();
    assert_eq!(
        mutations[0]["variables"],
        json!({ "issueId": "uuid-1", "body": format!("On it.\n\n<!-- keel-action:{id} -->") })
    );
    support::contracts::assert_linear_conforms(&all);
    app.assert_no_canary(LINEAR_CANARY).await;
}

#[tokio::test]
async fn a_worker_killed_after_its_call_is_not_followed_by_a_second_call() {
    let github = MockServer::start().await;
    answer(
        &github,
        "GET",
        "/repos/acme/widgets/issues",
        json!([issue(7, "open", T1)]),
    )
    .await;
    answer(&github, "GET", "/repos/acme/widgets/pulls", json!([])).await;
    answer(
        &github,
        "GET",
        "/repos/acme/widgets/issues/7",
        issue(7, "open", T1),
    )
    .await;
    // The comment is written when the call arrives; its answer is held long past the kill.
    let comments = "/repos/acme/widgets/issues/7/comments";
    let written = mount_list(&github, comments, Duration::from_secs(25)).await;
    let mut app = Tracked::start(&github_workflow(&github.uri()), TOKEN_ENV, &[]).await;
    let db_url = app.db_url.clone();
    app.worker_through(&db_url, "worker-a", TOKEN_ENV, DOOMED_LEASE_MS);
    let action = app.comment_reaching(&written).await;
    let mut killed = app.workers.remove(0);
    killed.kill9();
    assert!(
        !killed.log_text().contains(CANARY),
        "the token is in the killed worker's log"
    );
    assert_eq!(app.action(&action.id).await.status, ActionStatus::Sending);

    app.worker("worker-b", TOKEN_ENV);
    let sent = app.wait_action(&action, ActionStatus::Sent).await;
    assert_eq!(
        requests(&github, "POST", comments).await.len(),
        1,
        "sent twice"
    );
    assert_eq!(written.all().len(), 1);
    // Found by its marker in the comments list, not sent again.
    assert!(!requests(&github, "GET", comments).await.is_empty());
    let evidence = app.evidence(&sent).await;
    assert_eq!(
        evidence["evidence"]["answers"][0]["method"], "GET",
        "{evidence}"
    );
    assert_eq!(response(&sent)["id"], 900, "{sent:?}");
    app.assert_no_canary(CANARY).await;
}

/// The worker whose call reached GitHub is cut off from PostgreSQL (its proxy frozen:
/// connections hang, nothing is refused) before it can record the answer: it stops at its
/// lease's local deadline, the other worker finds the comment by its marker, and nothing
/// is POSTed twice, before or after the heal. (Multi-threaded: the proxy keeps forwarding
/// while the test waits for the healed worker to exit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_after_its_call_is_not_followed_by_a_second_call() {
    let github = MockServer::start().await;
    let issues = json!([issue(7, "open", T1)]);
    answer(&github, "GET", "/repos/acme/widgets/issues", issues).await;
    answer(&github, "GET", "/repos/acme/widgets/pulls", json!([])).await;
    let target = issue(7, "open", T1);
    answer(&github, "GET", "/repos/acme/widgets/issues/7", target).await;
    let comments = "/repos/acme/widgets/issues/7/comments";
    let written = mount_list(&github, comments, Duration::from_secs(25)).await;
    let mut app = Tracked::start(&github_workflow(&github.uri()), TOKEN_ENV, &[]).await;
    let proxy = support::proxy::DelayProxy::freezable(&app.db_url).await;
    app.worker_through(&proxy.url, "worker-cut", TOKEN_ENV, DOOMED_LEASE_MS);
    let action = app.comment_reaching(&written).await;
    let frozen = Instant::now();
    proxy.freeze();
    // The attempt stops at the deadline, its POST's answer (25 s away) unawaited.
    let abandoned = |log: String| {
        log.lines().any(|line| {
            line.contains("action_id") && line.contains("the job is left to its new owner")
        })
    };
    wait_for(
        Duration::from_secs(20),
        "the cut-off worker to abandon its call at its deadline",
        || async { abandoned(app.workers[0].log_text()).then_some(()) },
    )
    .await;
    let stopped = frozen.elapsed();

    app.worker("worker-b", TOKEN_ENV);
    let sent = app.wait_action(&action, ActionStatus::Sent).await;
    proxy.thaw();
    // Healed, the cut-off worker shuts down cleanly, having sent nothing more.
    let mut healed = app.workers.remove(0);
    healed.terminate(Duration::from_secs(30));
    assert_eq!(
        requests(&github, "POST", comments).await.len(),
        1,
        "sent twice"
    );
    assert_eq!(written.all().len(), 1);
    assert_eq!(response(&sent)["id"], 900, "{sent:?}");
    eprintln!(
        "tracker partition figures (lease 1000 ms): POSTs 1, repeated 0; freeze to the \
         cut-off worker stopping the action {stopped:?}"
    );
}

#[tokio::test]
async fn a_refusal_fails_the_action_and_a_rate_limit_sends_it_later_once() {
    let github = MockServer::start().await;
    let issues = json!([issue(7, "open", T1), issue(9, "open", T1)]);
    answer(&github, "GET", "/repos/acme/widgets/issues", issues).await;
    answer(&github, "GET", "/repos/acme/widgets/pulls", json!([])).await;
    answer(
        &github,
        "GET",
        "/repos/acme/widgets/issues/7",
        issue(7, "open", T1),
    )
    .await;
    answer(
        &github,
        "GET",
        "/repos/acme/widgets/issues/9",
        issue(9, "open", T1),
    )
    .await;
    let seven = "/repos/acme/widgets/issues/7/comments";
    // An attempt that lost its lease mid-send (a loaded machine) looks for its marker
    // before sending again: GitHub lists no comment on #7, so it sends and is refused.
    answer(&github, "GET", seven, json!([])).await;
    Mock::given(method("POST"))
        .and(path(seven))
        .respond_with(
            ResponseTemplate::new(422).set_body_json(json!({ "message": "Validation Failed" })),
        )
        .mount(&github)
        .await;
    // #9's first call is refused for the rate limit (nothing written), the next accepted.
    let nine = "/repos/acme/widgets/issues/9/comments";
    Mock::given(method("POST"))
        .and(path(nine))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "1"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&github)
        .await;
    let written = mount_list(&github, nine, Duration::ZERO).await;
    let app = Tracked::start(&github_workflow(&github.uri()), TOKEN_ENV, &["worker"]).await;

    let comment = json!({ "kind": "comment", "body": "Hello." });
    let (refused, approval) = app
        .proposed(&app.item("acme/widgets#7").await, comment.clone())
        .await;
    app.approve_and_execute(&approval).await;
    let (limited, approval) = app
        .proposed(&app.item("acme/widgets#9").await, comment)
        .await;
    app.approve_and_execute(&approval).await;

    let refused = app.wait_action(&refused, ActionStatus::Failed).await;
    assert_eq!(
        refused.last_error_code.as_deref(),
        Some("tracker_refused"),
        "{refused:?}"
    );
    let reason = refused.last_error.as_deref().unwrap();
    assert!(
        reason.contains("422") && reason.contains("Validation Failed"),
        "{reason}"
    );
    let evidence = app.evidence(&refused).await;
    assert_eq!(
        evidence["evidence"]["answers"][0]["http_status"], 422,
        "{evidence}"
    );
    // Once, or once more by an attempt that took over after a lease lost mid-send (the
    // refusal wrote nothing, so sending again repeats no effect); never a third time.
    let posts = requests(&github, "POST", seven).await.len();
    assert!(
        (1..=2).contains(&posts),
        "{posts} POSTs for one refused action"
    );

    // Sending when refused: the retry looks for the marker, finds none, sends once more.
    let sent = app.wait_action(&limited, ActionStatus::Sent).await;
    assert_eq!(requests(&github, "POST", nine).await.len(), 2);
    assert_eq!(written.all().len(), 1);
    assert!(!requests(&github, "GET", nine).await.is_empty());
    assert_answered_once(&sent, &written, &github, nine).await;
    assert_eq!(sent.last_error_code, None, "{sent:?}");
    app.assert_no_canary(CANARY).await;
}

/// [`github_workflow`] whose items' tasks push to a branch of their own,
/// `keel/<identifier>`.
pub(crate) fn branching_workflow(endpoint: &str) -> String {
    github_workflow(endpoint).replace(
        "  shell_command: echo imported\n",
        "  shell_command: echo imported\n  repo: /srv/git/widgets.git\n  base_branch: main\n  \
         push_branch: 'keel/{{ issue.identifier }}'\n",
    )
}

#[tokio::test]
async fn a_pull_request_is_opened_from_the_items_branch_into_its_base() {
    let github = MockServer::start().await;
    let issues = json!([issue(7, "open", T1)]);
    answer(&github, "GET", "/repos/acme/widgets/issues", issues).await;
    answer(
        &github,
        "GET",
        "/repos/acme/widgets/pulls",
        json!([pull(8, "aaa")]),
    )
    .await;
    let target = issue(7, "open", T1);
    answer(&github, "GET", "/repos/acme/widgets/issues/7", target).await;
    let pulls = "/repos/acme/widgets/pulls";
    let opened = json!({ "id": 7012, "number": 12,
                         "html_url": "https://github.com/acme/widgets/pull/12" });
    Mock::given(method("POST"))
        .and(path(pulls))
        .respond_with(ResponseTemplate::new(201).set_body_json(opened))
        .mount(&github)
        .await;
    let app = Tracked::start(&branching_workflow(&github.uri()), TOKEN_ENV, &["worker"]).await;
    let item = app.item("acme/widgets#7").await;
    let task = app.client.api.get_task(item.task_id.as_deref().unwrap());
    let task = task.await.unwrap().data;
    assert_eq!(task.push_branch.as_deref(), Some("keel/acme/widgets#7"));

    // Refused: on a pull request, with one branch for both ends, with a branch git refuses.
    let pull_item = app.item("acme/widgets#8").await;
    let (status, body) = app
        .propose(&pull_item.id, json!({ "kind": "pull_request" }))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "unsupported_action", "{body}");
    for bad in [
        json!({ "base": "keel/acme/widgets#7" }),
        json!({ "head": "a..b" }),
    ] {
        let mut request = bad.clone();
        request["kind"] = json!("pull_request");
        let (status, body) = app.propose(&item.id, request).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
    }

    let (action, approval) = app.proposed(&item, json!({ "kind": "pull_request" })).await;
    let id = action.id.as_str();
    let expected = json!({ "title": "issue 7", "head": "keel/acme/widgets#7", "base": "main",
                           "body": format!("Closes #7.\n\n<!-- keel-action:{id} -->") });
    assert_eq!(action.calls[0]["path"], pulls, "{action:?}");
    assert_eq!(action.calls[0]["body"], expected, "{action:?}");
    let summary = approval.action_summary.join("\n");
    assert!(
        summary.contains("pull request keel/acme/widgets#7 -> main: issue 7"),
        "{summary}"
    );
    app.approve_and_execute(&approval).await;
    let sent = app.wait_action(&action, ActionStatus::Sent).await;
    assert_eq!(
        response(&sent)["url"],
        "https://github.com/acme/widgets/pull/12",
        "{sent:?}"
    );
    let posts = requests(&github, "POST", pulls).await;
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(
        serde_json::from_slice::<Value>(&posts[0].body).unwrap(),
        expected
    );
    support::contracts::assert_github_conforms(&github.received_requests().await.unwrap());

    // A task that pushes no branch has nothing to open a pull request from.
    let plain = github_workflow(&github.uri()).replace("acme/widgets", "acme/gadgets");
    let (status, body) = app
        .client
        .post(
            "/v1/external-work/sources",
            json!({ "workflow_markdown": plain }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let source = support::record::<SourceRecord>(&body);
    let payload = json!({ "number": 3, "title": "gadget", "state": "open", "updated_at": T1 });
    let import = json!({ "source_id": source.id, "payload": payload });
    let (status, body) = app.client.post("/v1/external-work/import", import).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let gadget = &body["data"]["item"]["id"];
    let at = format!(
        "/v1/external-work/items/{}/actions",
        gadget.as_str().unwrap()
    );
    let (status, body) = app
        .client
        .post(&at, json!({ "kind": "pull_request" }))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["type"], "nothing_pushed", "{body}");
    app.assert_no_canary(CANARY).await;
}

#[tokio::test]
async fn a_cancelled_action_sends_nothing_and_its_pending_approval_is_rejected() {
    let github = MockServer::start().await;
    let issues = json!([issue(7, "open", T1)]);
    answer(&github, "GET", "/repos/acme/widgets/issues", issues).await;
    answer(&github, "GET", "/repos/acme/widgets/pulls", json!([])).await;
    let target = issue(7, "open", T1);
    answer(&github, "GET", "/repos/acme/widgets/issues/7", target).await;
    let comments = "/repos/acme/widgets/issues/7/comments";
    mount_list(&github, comments, Duration::ZERO).await;
    let app = Tracked::start(&github_workflow(&github.uri()), TOKEN_ENV, &["worker"]).await;
    let item = app.item("acme/widgets#7").await;
    let comment = json!({ "kind": "comment", "body": "Not yet." });

    // Pending: cancelled, its approval rejected with the reason, which then cannot be decided.
    let (pending, approval) = app.proposed(&item, comment.clone()).await;
    let (status, body) = app.cancel(&pending.id, "wrong issue").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let cancelled: ActionRecord = support::record(&body);
    assert_eq!(cancelled.status, ActionStatus::Cancelled, "{body}");
    assert_eq!(cancelled.cancel_reason.as_deref(), Some("wrong issue"));
    assert!(cancelled.cancelled_by.is_some() && cancelled.finished_at.is_some());
    let decided = app.client.api.get_approval(&approval.task_id, &approval.id);
    let decided = decided.await.unwrap().data;
    assert_eq!(decided.status, ApprovalStatus::Rejected, "{decided:?}");
    let note = decided.decision_note.as_deref().unwrap_or_default();
    assert!(note.contains("wrong issue"), "{decided:?}");
    let (status, body) = app.resolve(&approval, "approve").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // Approved, not yet executed: cancelled; an execute after is refused.
    let (approved, approval) = app.proposed(&item, comment).await;
    let (status, body) = app.resolve(&approval, "approve").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        app.action(&approved.id).await.status,
        ActionStatus::Approved
    );
    let (status, body) = app.cancel(&approved.id, "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = app.execute(&approved.id).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["type"], "action_not_executable", "{body}");
    let (status, body) = app.cancel(&approved.id, "again").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["type"], "action_not_cancellable", "{body}");
    let (status, body) = app.execute("xact_nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // Listed by status and kind, across items; a status that is none is refused.
    let listed = |status, kind| {
        app.client.api.list_actions(&ActionListFilter {
            status,
            kind,
            source_id: Some(app.source_id.clone()),
            ..ActionListFilter::default()
        })
    };
    let cancelled = listed(Some(ActionStatus::Cancelled), None).await.unwrap();
    let ids: Vec<&str> = cancelled.data.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, [pending.id.as_str(), approved.id.as_str()]);
    let labels = listed(None, Some(keel_client::ActionKind::Labels)).await;
    assert!(labels.unwrap().data.is_empty());
    let (status, body) = app
        .client
        .get("/v1/external-work/actions?status=gone")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request", "{body}");

    // Items across sources, by state and kind.
    let items = |state, kind| {
        app.client
            .api
            .list_work_items(&keel_client::ItemListFilter {
                state,
                kind,
                ..Default::default()
            })
    };
    let claimed = items(Some(keel_client::ItemState::Claimed), None).await;
    let claimed: Vec<String> = claimed.unwrap().data.into_iter().map(|i| i.id).collect();
    assert!(claimed.contains(&item.id), "{claimed:?}");
    let pulls = items(None, Some(keel_client::ItemKind::GithubPullRequest)).await;
    assert!(pulls.unwrap().data.is_empty());
    let (status, body) = app.client.get("/v1/external-work/items?kind=jira").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    assert!(requests(&github, "POST", comments).await.is_empty());
    app.assert_no_canary(CANARY).await;
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
