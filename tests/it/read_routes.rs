//! The reads of issue 33 over real HTTP: the workspace's runs (`GET /v1/runs`), a step by
//! id, a task's artifacts across its runs, an external-work item by id and the approval
//! inbox by run; each within the caller's workspace, and a bad filter refused with the
//! error envelope.

use crate::support;
use crate::support::two_orgs::{REMOTE_ENV, org_client};

use std::time::Duration;

use crate::support::{Client, KeelProcess, TestApp, shell};
use futures_util::TryStreamExt;
use keel_client::{
    ApprovalRecord, ApprovalStatus, ArtifactRecord, Call, Imported, ItemRecord, ListEnvelope,
    RunRecord, RunStatus, StepRecord, TransitionRecord,
};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// A source tracking a GitHub repository whose items become shell tasks.
const WORKFLOW: &str = "---\ntracker: {kind: github, repository: acme/widgets}\n\
                        task: {execution_kind: shell, shell_command: echo ext}\n---\n\
                        Work on {{ issue.title }}";

/// Three finished runs, in the order they were created: task `a`'s first (completed),
/// task `b`'s (failed), task `a`'s second (completed).
struct History {
    a: String,
    b: String,
    runs: Vec<RunRecord>,
}

async fn history(c: &Client) -> History {
    let a = c.create_task(&shell("echo one; echo two >&2")).await.id;
    let b = c.create_task(&shell("exit 3")).await.id;
    let mut runs = Vec::new();
    for task_id in [&a, &b, &a] {
        // One active run per task: each ends before the next starts.
        let run = c.start(task_id).await;
        runs.push(c.wait_terminal(task_id, &run.id, RUN_TIMEOUT).await);
    }
    let statuses: Vec<RunStatus> = runs.iter().map(|r| r.status).collect();
    let expected = [
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Completed,
    ];
    assert_eq!(statuses, expected, "{runs:?}");
    History { a, b, runs }
}

/// Records as their JSON: the wire types compare as the client sees them.
fn json_of<T: serde::Serialize>(record: &T) -> Value {
    serde_json::to_value(record).unwrap()
}

/// The ids of a list answered 200.
async fn ids(c: &Client, path: &str) -> Vec<String> {
    let (status, body) = c.get(path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    body["data"]
        .as_array()
        .unwrap_or_else(|| panic!("{path}: {body}"))
        .iter()
        .map(|row| row["id"].as_str().unwrap().to_string())
        .collect()
}

/// A refusal with the error envelope: its status, type, and a message naming `mention`.
async fn assert_refused(c: &Client, path: &str, status: StatusCode, kind: &str, mention: &str) {
    let (got, body) = c.get(path).await;
    assert_eq!(got, status, "{path}: {body}");
    let error = &body["error"];
    assert_eq!(error["type"], kind, "{path}: {body}");
    assert!(
        error["message"].as_str().unwrap().contains(mention),
        "{path}: {body}"
    );
    assert!(error["request_id"].is_string(), "{path}: {body}");
}

#[tokio::test]
async fn the_workspace_runs_list_pages_every_task_by_status_and_task() {
    let app = TestApp::start().await;
    let c = &app.client;
    let History { a, b, runs } = history(c).await;
    let run_ids =
        |picked: &[usize]| -> Vec<String> { picked.iter().map(|&i| runs[i].id.clone()).collect() };

    // Oldest first, as a task's own list: the records are the task list's, field for field.
    let (status, body) = c.get("/v1/runs").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let all = support::page::<RunRecord>(&body).data;
    assert_eq!(
        all.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        run_ids(&[0, 1, 2])
    );
    let (_, own) = c.get(&format!("/v1/tasks/{a}/runs")).await;
    let (_, filtered) = c.get(&format!("/v1/runs?task_id={a}")).await;
    assert_eq!(filtered["data"], own["data"], "{filtered}");
    assert_eq!(own["data"].as_array().unwrap().len(), 2, "{own}");

    assert_eq!(ids(c, "/v1/runs?status=failed").await, run_ids(&[1]));
    assert_eq!(ids(c, "/v1/runs?status=completed").await, run_ids(&[0, 2]));
    let path = format!("/v1/runs?task_id={b}&status=failed");
    assert_eq!(ids(c, &path).await, run_ids(&[1]));
    let path = format!("/v1/runs?task_id={b}&status=completed");
    assert_eq!(ids(c, &path).await, Vec::<String>::new());
    assert_eq!(
        ids(c, "/v1/runs?status=running").await,
        Vec::<String>::new()
    );

    // A page at a time: the cursor carries on where the last page ended.
    let (_, first) = c.get("/v1/runs?limit=2").await;
    assert_eq!(first["has_more"], true, "{first}");
    assert_eq!(first["next_cursor"], json!(runs[1].id), "{first}");
    let paged: Vec<RunRecord> = c
        .api
        .list_workspace_runs(None, None)
        .query("limit", Some(1))
        .items()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(json_of(&paged), json_of(&all));
    let completed = c.api.list_workspace_runs(Some("completed"), Some(&a));
    let completed = completed.await.unwrap().data;
    assert_eq!(json_of(&completed), json_of(&[&runs[0], &runs[2]]));

    // Newest first, a page at a time, with and without filters: the same runs reversed.
    for (status, task, picked) in [
        (None, None, vec![2, 1, 0]),
        (Some("completed"), None, vec![2, 0]),
        (None, Some(a.as_str()), vec![2, 0]),
        (Some("failed"), Some(b.as_str()), vec![1]),
    ] {
        let newest = read_newest_first(c.api.list_workspace_runs(status, task), 1).await;
        let newest: Vec<String> = newest.into_iter().map(|r| r.id).collect();
        assert_eq!(newest, run_ids(&picked), "{status:?} {task:?}");
    }
    // The CLI lists newest first unless told otherwise.
    let listed = crate::cli::cli(&c.base, &["runs", "list", "--quiet"]).await;
    assert_eq!(
        crate::cli::stdout(&listed).lines().collect::<Vec<_>>(),
        run_ids(&[2, 1, 0])
    );
    let args = ["runs", "list", &a, "--oldest-first", "--quiet"];
    let oldest = crate::cli::cli(&c.base, &args).await;
    assert_eq!(
        crate::cli::stdout(&oldest).lines().collect::<Vec<_>>(),
        run_ids(&[0, 2])
    );

    let bad = StatusCode::BAD_REQUEST;
    assert_refused(
        c,
        "/v1/runs?status=sleeping",
        bad,
        "invalid_request",
        "sleeping",
    )
    .await;
    assert_refused(c, "/v1/runs?limit=0", bad, "invalid_request", "limit").await;
    assert_refused(c, "/v1/runs?colour=red", bad, "invalid_request", "colour").await;
    assert_refused(c, "/v1/runs?order=up", bad, "invalid_request", "order").await;
}

#[tokio::test]
async fn a_step_reads_by_id_under_its_own_run() {
    let app = TestApp::start().await;
    let c = &app.client;
    let History { a, runs, .. } = history(c).await;
    let (first, second) = (&runs[0].id, &runs[2].id);
    let steps = c.api.list_steps(&a, first).await.unwrap().data;
    assert_eq!(steps.len(), 1, "{steps:?}");

    let path = format!("/v1/tasks/{a}/runs/{first}/steps/{}", steps[0].id);
    let (status, body) = c.get(&path).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "task_step");
    let read: StepRecord = support::record(&body);
    assert_eq!(json_of(&read), json_of(&steps[0]));
    let typed = c.api.get_step(&a, first, &steps[0].id).await.unwrap().data;
    assert_eq!(json_of(&typed), json_of(&steps[0]));

    // Another run of the same task does not have it; nor does any run have a made-up step.
    let not_found = StatusCode::NOT_FOUND;
    let elsewhere = format!("/v1/tasks/{a}/runs/{second}/steps/{}", steps[0].id);
    assert_refused(c, &elsewhere, not_found, "not_found", "step").await;
    let made_up = keel::domain::new_id("step");
    let path = format!("/v1/tasks/{a}/runs/{first}/steps/{made_up}");
    assert_refused(c, &path, not_found, "not_found", "step").await;
    let path = format!("/v1/tasks/{a}/runs/run_nope/steps/{}", steps[0].id);
    assert_refused(c, &path, not_found, "not_found", "run").await;

    // Only an agent loop's run has a transcript: a shell run's output is its logs.
    let path = format!("/v1/tasks/{a}/runs/{first}/transcript");
    let (unsupported, logs) = (StatusCode::UNPROCESSABLE_ENTITY, "keel runs logs");
    assert_refused(c, &path, unsupported, "unsupported_capability", logs).await;
    let path = format!("/v1/tasks/{a}/runs/{first}/stream?projection=transcript");
    assert_refused(c, &path, unsupported, "unsupported_capability", logs).await;
    let path = format!("/v1/tasks/{a}/runs/{first}/context");
    assert_refused(c, &path, unsupported, "unsupported_capability", logs).await;
}

#[tokio::test]
async fn a_tasks_artifacts_are_those_of_all_its_runs() {
    let app = TestApp::start().await;
    let c = &app.client;
    let History { a, b, runs } = history(c).await;
    let mut expected = Vec::new();
    for run in [&runs[0], &runs[2]] {
        expected.extend(c.api.list_artifacts(&a, &run.id).await.unwrap().data);
    }
    expected.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(
        expected.len(),
        4,
        "stdout and stderr of each run: {expected:?}"
    );

    let (status, body) = c.get(&format!("/v1/tasks/{a}/artifacts")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed = support::page::<ArtifactRecord>(&body).data;
    assert_eq!(json_of(&listed), json_of(&expected));
    let paged: Vec<ArtifactRecord> = c
        .api
        .list_task_artifacts(&a)
        .query("limit", Some(3))
        .items()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(json_of(&paged), json_of(&expected));
    // Task b's own run's artifacts, and none of a's.
    let of_b = c.api.list_task_artifacts(&b).await.unwrap().data;
    assert!(!of_b.is_empty());
    assert!(
        of_b.iter()
            .all(|x| x.run_id.as_deref() == Some(&runs[1].id))
    );

    let path = "/v1/tasks/task_nope/artifacts";
    assert_refused(c, path, StatusCode::NOT_FOUND, "not_found", "task").await;
    let path = format!("/v1/tasks/{a}/artifacts?cursor=x&limit=500");
    assert_refused(
        c,
        &path,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "limit",
    )
    .await;
}

/// Registers [`WORKFLOW`]'s source and imports issue `number`: the new item.
async fn imported_item(c: &Client, number: u64) -> ItemRecord {
    let source = json!({ "workflow_markdown": WORKFLOW });
    let (status, body) = c.post("/v1/external-work/sources", source).await;
    assert!(status.is_success(), "{body}");
    let source_id = body["data"]["id"].as_str().unwrap().to_string();
    let payload = json!({ "number": number, "title": "broken", "state": "open",
                          "updated_at": "2026-01-01T00:00:00Z" });
    let import = json!({ "source_id": source_id, "payload": payload });
    let (status, body) = c.post("/v1/external-work/import", import).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    support::record::<Imported>(&body).item
}

#[tokio::test]
async fn an_external_work_item_reads_by_id() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let item = imported_item(c, 7).await;

    let (status, body) = c.get(&format!("/v1/external-work/items/{}", item.id)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "external_work_item");
    let read: ItemRecord = support::record(&body);
    // The record the source's item list holds, field for field.
    let listed = c.api.list_items(&item.source_id).await.unwrap().data;
    assert_eq!(json_of(&listed), json_of(&[&read]));
    assert_eq!(read.identifier, "acme/widgets#7");
    assert!(read.task_id.is_some(), "{read:?}");
    let typed = c.api.get_item(&item.id).await.unwrap().data;
    assert_eq!(json_of(&typed), json_of(&read));

    let made_up = keel::domain::new_id("item");
    let path = format!("/v1/external-work/items/{made_up}");
    assert_refused(c, &path, StatusCode::NOT_FOUND, "not_found", "item").await;
}

/// Every item of a list read newest first (`order=desc`), `limit` a page.
async fn read_newest_first<T: DeserializeOwned>(
    call: Call<'_, ListEnvelope<T>>,
    limit: i64,
) -> Vec<T> {
    let call = call
        .query("order", Some("desc"))
        .query("limit", Some(limit));
    call.items().try_collect().await.unwrap()
}

#[tokio::test]
async fn the_approval_inbox_narrows_to_one_run() {
    let app = TestApp::with_approvals("shell_exec").await;
    let c = &app.client;
    let (task_id, first) = c.run_shell("echo first").await;
    let (_, second) = c.run_shell("echo second").await;
    let inbox = c.api.list_approvals(None).await.unwrap().data;
    assert_eq!(inbox.len(), 2, "{inbox:?}");

    let of_first = ids(c, &format!("/v1/approvals?run_id={first}")).await;
    let expected: Vec<String> = inbox
        .iter()
        .filter(|a| a.run_id == first)
        .map(|a| a.id.clone())
        .collect();
    assert_eq!(of_first, expected);
    assert_eq!(expected.len(), 1);
    let typed = c.api.list_run_approvals(&second, Some("pending")).await;
    let typed: Vec<ApprovalRecord> = typed.unwrap().data;
    assert_eq!(typed.len(), 1);
    assert_eq!(typed[0].run_id, second);
    assert_eq!(typed[0].status, ApprovalStatus::Pending);
    let path = format!("/v1/approvals?run_id={first}&status=approved");
    assert_eq!(ids(c, &path).await, Vec::<String>::new());
    // The task's own list takes the run filter too.
    let path = format!("/v1/tasks/{task_id}/approvals?run_id={second}");
    assert_eq!(ids(c, &path).await, Vec::<String>::new());
    let path = format!("/v1/approvals?run_id={}", keel::domain::new_id("run"));
    assert_eq!(ids(c, &path).await, Vec::<String>::new());

    // Newest first, a page at a time, for the inbox and the task's list; the CLI too.
    let newest_first = |task: Option<&str>| -> Vec<String> {
        let of_task = inbox.iter().filter(|a| task.is_none_or(|t| a.task_id == t));
        of_task.rev().map(|a| a.id.clone()).collect()
    };
    for (call, task) in [
        (c.api.list_approvals(None), None),
        (
            c.api.list_task_approvals(&task_id, None),
            Some(task_id.as_str()),
        ),
    ] {
        let paged = read_newest_first(call, 1).await;
        let paged: Vec<String> = paged.into_iter().map(|a| a.id).collect();
        assert_eq!(paged, newest_first(task));
    }
    let listed = crate::cli::cli(&c.base, &["approvals", "list", "--quiet"]).await;
    let listed = crate::cli::stdout(&listed);
    assert_eq!(listed.lines().collect::<Vec<_>>(), newest_first(None));

    // The audit trail too: newest first, paging on to older changes.
    let oldest: Vec<TransitionRecord> = c
        .api
        .state_transitions(None, None)
        .items()
        .try_collect()
        .await
        .unwrap();
    let newest = read_newest_first(c.api.state_transitions(None, None), 2).await;
    let ids_of = |t: &[TransitionRecord]| t.iter().map(|t| t.id).collect::<Vec<_>>();
    let mut reversed = ids_of(&oldest);
    reversed.reverse();
    assert!(reversed.len() > 2, "{oldest:?}");
    assert_eq!(ids_of(&newest), reversed);

    let path = format!("/v1/approvals?run_id={first}&status=sideways");
    let bad = StatusCode::BAD_REQUEST;
    assert_refused(c, &path, bad, "invalid_request", "sideways").await;
    assert_refused(c, "/v1/approvals?order=up", bad, "invalid_request", "order").await;
    let path = "/v1/state-transitions?order=sideways";
    assert_refused(c, path, bad, "invalid_request", "order").await;
}

/// A `keel api` in remote mode (shell runs wait for approval) and a member of each of two
/// orgs: each org has a workspace of its own.
struct TwoOrgs {
    _api: KeelProcess,
    a: Client,
    b: Client,
    _logs: tempfile::TempDir,
}

async fn two_orgs() -> TwoOrgs {
    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let gated = [("KEEL_APPROVAL_POLICIES", "shell_exec")];
    let env = [REMOTE_ENV.as_slice(), &gated].concat();
    let api = support::spawn_api_with_env(&db, logs.path(), "api", &env).await;
    let base = api.client.as_ref().unwrap().base.clone();
    TwoOrgs {
        _api: api,
        a: org_client(&base, "a"),
        b: org_client(&base, "b"),
        _logs: logs,
    }
}

/// `path` answers the other org exactly as a made-up id in the same place does: 404.
async fn hidden(c: &Client, path: &str, real: &str, made_up: &str) {
    let (status, body) = c.get(path).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    let (_, baseline) = c.get(&path.replace(real, made_up)).await;
    let strip = |mut body: Value| {
        body["error"].as_object_mut().unwrap().remove("request_id");
        body
    };
    assert_eq!(strip(body), strip(baseline), "{path}");
}

#[tokio::test]
async fn the_new_reads_stay_in_their_workspace() {
    let orgs = two_orgs().await;
    let (a, b) = (&orgs.a, &orgs.b);
    let (a_task, a_run) = a.run_shell("echo a").await;
    let (b_task, b_run) = b.run_shell("echo b").await;

    // Each org lists its own runs and approvals alone, whatever the filter names.
    assert_eq!(ids(a, "/v1/runs").await, vec![a_run.clone()]);
    assert_eq!(ids(b, "/v1/runs").await, vec![b_run.clone()]);
    assert_eq!(ids(b, &format!("/v1/runs?task_id={a_task}")).await.len(), 0);
    let awaiting = "/v1/runs?status=awaiting_approval";
    assert_eq!(ids(b, awaiting).await, vec![b_run.clone()]);
    let a_approvals = ids(a, &format!("/v1/approvals?run_id={a_run}")).await;
    assert_eq!(a_approvals.len(), 1);
    assert_eq!(
        ids(b, &format!("/v1/approvals?run_id={a_run}")).await.len(),
        0
    );

    // The other org's rows read as made-up ids do.
    let a_item = imported_item(a, 1).await;
    let item = format!("/v1/external-work/items/{}", a_item.id);
    hidden(b, &item, &a_item.id, &keel::domain::new_id("item")).await;
    let own = a.api.get_item(&a_item.id).await.unwrap().data;
    assert_eq!(json_of(&own), json_of(&a_item));
    let artifacts = format!("/v1/tasks/{a_task}/artifacts");
    hidden(b, &artifacts, &a_task, &keel::domain::new_id("task")).await;
    assert_eq!(ids(a, &artifacts).await.len(), 0, "no worker ran it");
    // A step under the other org's run, and the other org's run under one's own task.
    let step = format!("/v1/tasks/{a_task}/runs/{a_run}/steps/step_x");
    hidden(b, &step, &a_run, &keel::domain::new_id("run")).await;
    let step = format!("/v1/tasks/{b_task}/runs/{a_run}/steps/step_x");
    hidden(b, &step, &a_run, &keel::domain::new_id("run")).await;
}
