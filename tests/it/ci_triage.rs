//! CI triage (seed 000 §Triage GitHub CI) against real `keel api` and `keel worker`
//! processes and a local server speaking GitHub's REST API: a pull request item's failing
//! jobs and check runs are read by the worker with GETs only and recorded once per head,
//! each with redacted evidence and a fix task on the pull request's branch; the same scan
//! again finds them as duplicates; a record's fix run starts once however often it is asked
//! for; a head that moved on is recorded stale and no CI is read for it.

use crate::cli::{cli, stdout};
use crate::external_actions::branching_workflow;
use crate::support;

use std::time::Duration;

use crate::support::{KeelProcess, rows_containing, wait_for};
use keel_client::{
    FixRun, ItemRecord, ScanStatus, SourceRecord, TaskRecord, TriageListFilter, TriageRecord,
    TriageScan, TriageStatus, TriageSummary,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

const CANARY: &str = "ghp_triagecanary0123456789abcdef";
const TOKEN_ENV: (&str, &str) = ("ACME_GITHUB_TOKEN", CANARY);
const T1: &str = "2026-11-30T09:00:00Z";

fn pull(sha: &str) -> Value {
    json!({ "id": 2008, "number": 8, "title": "Add the widget", "state": "open",
            "updated_at": T1, "html_url": "https://github.com/acme/widgets/pull/8",
            "head": { "sha": sha, "ref": "feature/widget" } })
}

async fn answer(github: &MockServer, at: &str, body: Value) {
    Mock::given(method("GET"))
        .and(path(at))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .mount(github)
        .await;
}

/// GitHub with pull request #8 (head `aaa`) and issue #7; on `aaa`, workflow `CI` failed
/// in its job `test` (whose log ends with the error, and leaks the token), `Lint`
/// succeeded, and the check run `codecov` (no job) failed.
async fn github() -> MockServer {
    let github = MockServer::start().await;
    let issue = json!({ "id": 1007, "number": 7, "title": "Widget", "state": "open",
                        "updated_at": T1 });
    answer(&github, "/repos/acme/widgets/issues", json!([issue])).await;
    answer(&github, "/repos/acme/widgets/pulls", json!([pull("aaa")])).await;
    answer(&github, "/repos/acme/widgets/pulls/8", pull("aaa")).await;
    Mock::given(method("GET"))
        .and(path("/repos/acme/widgets/actions/runs"))
        .and(query_param("head_sha", "aaa"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({ "total_count": 2,
            "workflow_runs": [
                { "id": 31, "name": "CI", "head_sha": "aaa", "conclusion": "failure" },
                { "id": 32, "name": "Lint", "head_sha": "aaa", "conclusion": "success" } ] })),
        )
        .mount(&github)
        .await;
    let jobs = json!({ "total_count": 2, "jobs": [
        { "id": 501, "name": "test", "conclusion": "failure",
          "html_url": "https://github.com/acme/widgets/actions/runs/31/job/501" },
        { "id": 502, "name": "build", "conclusion": "success" } ] });
    answer(&github, "/repos/acme/widgets/actions/runs/31/jobs", jobs).await;
    let checks = json!({ "total_count": 3, "check_runs": [
        { "id": 501, "name": "test", "conclusion": "failure" },
        { "id": 777, "name": "codecov", "conclusion": "failure",
          "html_url": "https://github.com/acme/widgets/runs/777",
          "output": { "title": "Coverage dropped", "summary": "-3% on widget.rs" } },
        { "id": 778, "name": "fmt", "conclusion": "success" } ] });
    answer(
        &github,
        "/repos/acme/widgets/commits/aaa/check-runs",
        checks,
    )
    .await;
    // GitHub answers a job's log with a redirect to where the log is.
    Mock::given(method("GET"))
        .and(path("/repos/acme/widgets/actions/jobs/501/logs"))
        .respond_with(
            ResponseTemplate::new(302)
                .insert_header("location", format!("{}/job-logs/501.txt", github.uri())),
        )
        .mount(&github)
        .await;
    let log = format!(
        "{}\n2026-11-30T09:01:00Z token {CANARY} leaked\nerror: widget::tests::spins failed\n",
        "2026-11-30T09:00:00Z compiling\n".repeat(5000)
    );
    Mock::given(method("GET"))
        .and(path("/job-logs/501.txt"))
        .respond_with(ResponseTemplate::new(200).set_body_string(log))
        .mount(&github)
        .await;
    github
}

struct App {
    dir: tempfile::TempDir,
    db_url: String,
    api: KeelProcess,
    client: support::Client,
    _worker: KeelProcess,
}

impl App {
    async fn start(markdown: &str) -> (App, ItemRecord, ItemRecord) {
        let dir = tempfile::tempdir().unwrap();
        let db_url = support::fresh_database().await;
        let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &[TOKEN_ENV]).await;
        let client = api.client.clone().unwrap();
        let (status, body) = client
            .post(
                "/v1/external-work/sources",
                json!({ "workflow_markdown": markdown }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let source = support::record::<SourceRecord>(&body);
        let poll = format!("/v1/external-work/sources/{}/poll", source.id);
        let (status, body) = client.post(&poll, json!({})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let data = dir.path().join("worker");
        std::fs::create_dir_all(&data).unwrap();
        let worker = support::spawn_worker_with_env(
            &db_url,
            dir.path(),
            "worker",
            5000,
            &data,
            &[TOKEN_ENV],
        );
        let items = client.api.list_items(&source.id).await.unwrap().data;
        let find = |identifier: &str| {
            items
                .iter()
                .find(|i| i.identifier == identifier)
                .unwrap_or_else(|| panic!("no item {identifier}: {items:?}"))
                .clone()
        };
        let (pull, issue) = (find("acme/widgets#8"), find("acme/widgets#7"));
        let app = App {
            dir,
            db_url,
            api,
            client,
            _worker: worker,
        };
        (app, pull, issue)
    }

    async fn triage(&self, item: &ItemRecord, body: Value) -> (StatusCode, Value) {
        let at = format!("/v1/external-work/items/{}/ci-triage", item.id);
        self.client.post(&at, body).await
    }

    /// Triages the item and waits for its scan to end; returns the scan and its summary.
    async fn triaged(&self, item: &ItemRecord) -> (TriageScan, TriageSummary) {
        let (status, body) = self.triage(item, json!({})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let scan: TriageScan = support::record(&body);
        assert_eq!(scan.status, ScanStatus::Queued);
        let scan = wait_for(Duration::from_secs(30), "the scan to end", || async {
            let scan = self
                .client
                .api
                .get_triage_scan(&scan.id)
                .await
                .unwrap()
                .data;
            (scan.status != ScanStatus::Queued).then_some(scan)
        })
        .await;
        assert_eq!(scan.status, ScanStatus::Done, "{scan:?}");
        let summary = serde_json::from_value(scan.summary.clone().unwrap()).unwrap();
        (scan, summary)
    }

    async fn records(&self, status: Option<TriageStatus>) -> Vec<TriageRecord> {
        let filter = TriageListFilter {
            status,
            ..TriageListFilter::default()
        };
        self.client.api.list_triage(&filter).await.unwrap().data
    }

    async fn fix(&self, record: &TriageRecord) -> (StatusCode, Value) {
        let at = format!("/v1/external-work/ci-triage/{}/run", record.id);
        self.client.post_empty(&at).await
    }
}

#[tokio::test]
async fn failing_checks_become_fix_tasks_once_per_head_and_a_stale_head_reads_no_ci() {
    let github = github().await;
    let (app, pull_item, issue_item) = App::start(&branching_workflow(&github.uri())).await;

    let (_, summary) = app.triaged(&pull_item).await;
    let expected = TriageSummary {
        triaged: 2,
        task_created: 2,
        triage_ids: summary.triage_ids.clone(),
        ..TriageSummary::default()
    };
    assert_eq!(summary, expected);
    let records = app.records(Some(TriageStatus::TaskCreated)).await;
    let names: Vec<&str> = records.iter().map(|r| r.check_name.as_str()).collect();
    assert_eq!(names, ["CI / test", "codecov"], "{records:?}");
    let test = &records[0];
    assert_eq!(
        (test.check_id, test.head_sha.as_str(), test.subject_number),
        (Some(501), "aaa", 8)
    );
    assert_eq!(test.head_ref.as_deref(), Some("feature/widget"));
    let task_id = test.task_id.as_deref().unwrap();
    assert_eq!(
        test.idempotency_key,
        format!("ci-triage:{}:{task_id}:aaa", test.id)
    );

    // The fix task: the pull request's branch, its results on a branch of their own, and a
    // prompt with what failed, the log's end, and the rule about GitHub.
    let task: TaskRecord = app.client.api.get_task(task_id).await.unwrap().data;
    assert_eq!(task.base_branch.as_deref(), Some("feature/widget"));
    assert_eq!(task.push_branch.as_deref(), Some("keel/ci-fix/8-aaa"));
    let prompt = task.prompt.as_deref().unwrap();
    for part in [
        "\"CI / test\" failed (failure) on acme/widgets#8 at commit aaa",
        "error: widget::tests::spins failed",
        "Do not push, comment, review, merge",
    ] {
        assert!(prompt.contains(part), "{part} not in {prompt}");
    }
    let codecov_task = records[1].task_id.as_deref().unwrap();
    let codecov = app.client.api.get_task(codecov_task).await.unwrap().data;
    assert!(codecov.prompt.unwrap().contains("Coverage dropped"));

    // The evidence: the log's end, redacted, an artifact of the item's run.
    let (task, run) = (
        pull_item.task_id.clone().unwrap(),
        pull_item.run_id.clone().unwrap(),
    );
    let artifact = test.artifact_id.as_deref().unwrap();
    let content = app.client.api.artifact_content(&task, &run, artifact);
    let (status, bytes) = content.raw_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let evidence: Value = serde_json::from_slice(&bytes).unwrap();
    let tail = evidence["log_tail"].as_str().unwrap();
    assert!(
        tail.ends_with("error: widget::tests::spins failed"),
        "{tail:.200}"
    );
    assert!(
        tail.len() <= 64 * 1024 && !tail.contains(CANARY),
        "{}",
        tail.len()
    );

    // Again, from the CLI, waiting for the worker: the same failures of the same head are
    // duplicates, and nothing new is made.
    let url = app.client.base.clone();
    let waited = cli(
        &url,
        &["external-work", "ci", "triage", &pull_item.id, "--wait"],
    )
    .await;
    let printed = stdout(&waited);
    assert!(waited.status.success(), "{printed}");
    for (field, value) in [("status", "done"), ("duplicates", "2"), ("triaged", "0")] {
        let row = printed.lines().find(|l| l.trim_start().starts_with(field));
        assert!(
            row.is_some_and(|r| r.trim_end().ends_with(value)),
            "{field}: {printed}"
        );
    }
    assert!(printed.contains(&summary.triage_ids[0]), "{printed}");
    assert_eq!(app.records(None).await.len(), 2);
    let listed = cli(
        &url,
        &["external-work", "ci", "list", "--status", "task_created"],
    )
    .await;
    let listed = stdout(&listed);
    assert!(
        listed.contains("CI / test") && listed.contains("codecov"),
        "{listed}"
    );

    // The fix run: started once, whoever asks again.
    let (status, body) = app.fix(test).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let first: FixRun = support::record(&body);
    assert_eq!(first.triage.status, TriageStatus::RunRequested);
    assert_eq!(first.triage.run_id.as_ref(), Some(&first.run.id));
    let (status, body) = app.fix(test).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let second: FixRun = support::record(&body);
    assert_eq!(second.run.id, first.run.id);

    // The head moved on: a stale record of the old head, and no CI read for either.
    let checks_read = || async {
        let all = github.received_requests().await.unwrap();
        all.iter()
            .filter(|r| r.url.path().contains("/check-runs") || r.url.path().contains("/actions/"))
            .count()
    };
    let before = checks_read().await;
    Mock::given(method("GET"))
        .and(path("/repos/acme/widgets/pulls/8"))
        .respond_with(ResponseTemplate::new(200).set_body_json(pull("bbb")))
        .with_priority(1)
        .mount(&github)
        .await;
    let (_, stale) = app.triaged(&pull_item).await;
    assert_eq!((stale.stale, stale.triaged), (1, 0), "{stale:?}");
    assert_eq!(checks_read().await, before, "CI was read for a stale head");
    let stale_records = app.records(Some(TriageStatus::Stale)).await;
    assert_eq!(stale_records.len(), 1);
    assert_eq!(stale_records[0].head_sha, "aaa");
    assert!(
        stale_records[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("now bbb")
    );
    let (status, body) = app.fix(&stale_records[0]).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["type"], "triage_not_runnable", "{body}");

    // Refusals.
    let (status, body) = app.triage(&issue_item, json!({})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "unsupported_action", "{body}");
    let (status, body) = app.triage(&pull_item, json!({ "limit": 0 })).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, _) = app
        .client
        .get("/v1/external-work/ci-triage/citri_nope")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app
        .client
        .get("/v1/external-work/ci-triage?status=sideways")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // GitHub was only read, each request one of its published operations.
    let all = github.received_requests().await.unwrap();
    assert!(all.iter().all(|r| r.method.as_str() == "GET"));
    let api: Vec<_> = all
        .into_iter()
        .filter(|r| r.url.path().starts_with("/repos/"))
        .collect();
    support::contracts::assert_github_conforms(&api);
    assert_eq!(
        rows_containing(&app.db_url, CANARY).await,
        Vec::<String>::new()
    );
    drop(app.api);
    let log = std::fs::read_to_string(app.dir.path().join("api.log")).unwrap();
    assert!(!log.contains(CANARY));
}
