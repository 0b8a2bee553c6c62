//! External work against real `keel` processes: WORKFLOW.md errors over HTTP and on the
//! command line, sources, GitHub polls against a local server speaking GitHub's REST
//! protocol (ETags, 304, rate limits), Linear polls against one speaking Linear's GraphQL
//! (pages, `RATELIMITED`), and imports that create each task once.

use crate::support;

use std::time::Duration;

use crate::support::tracker;
use crate::support::{Client, KeelProcess, TestApp, rows_containing, wait_for};
use keel_client::{
    Imported, ItemRecord, ItemState, PollSummary, Rendered, RunStatus, SourceRecord, TaskStatus,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tracker::{CANARY, TOKEN_ENV, github_issue, items_of, list, register, run_of};
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const WORKFLOW: &str = "---
tracker:
  kind: github
  repository: acme/widgets
task:
  execution_kind: shell
  shell_command: echo imported
---
Fix {{ issue.identifier }}: {{ issue.title }}{% if attempt %} (attempt {{ attempt }}){% endif %}
";

fn issue() -> Value {
    json!({ "id": "1", "identifier": "acme/widgets#7", "title": "broken", "state": "open" })
}

#[tokio::test]
async fn render_answers_every_workflow_error_class_with_its_type() {
    let app = TestApp::api_only().await;
    let render = |markdown: &str, issue: Value| {
        let body = json!({ "workflow_markdown": markdown, "issue": issue, "attempt": 2 });
        app.client.post("/v1/external-work/render", body)
    };
    let (status, body) = render(WORKFLOW, issue()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        support::record::<Rendered>(&body).prompt,
        "Fix acme/widgets#7: broken (attempt 2)"
    );
    let cases = [
        ("---\ntracker: [\n---\n", "workflow_parse_error"),
        ("---\n- a list\n---\n", "workflow_front_matter_not_a_map"),
        ("{% if %}", "template_parse_error"),
        ("{{ issue.title | shout }}", "template_render_error"),
        ("{{ issue.missing }}", "template_render_error"),
    ];
    for (markdown, expected) in cases {
        let (status, body) = render(markdown, issue()).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{markdown}: {body}"
        );
        assert_eq!(body["error"]["type"], expected, "{markdown}: {body}");
    }
    let (status, body) = render(WORKFLOW, json!({ "title": "no id" })).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request");
}

#[test]
fn keel_workflow_checks_and_renders_and_fails_with_the_error_class() {
    let dir = tempfile::tempdir().unwrap();
    let (workflow, broken, issue_file) = (
        dir.path().join("WORKFLOW.md"),
        dir.path().join("BROKEN.md"),
        dir.path().join("issue.json"),
    );
    std::fs::write(&workflow, WORKFLOW).unwrap();
    std::fs::write(&broken, "---\n- not a map\n---\n").unwrap();
    std::fs::write(&issue_file, issue().to_string()).unwrap();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (ok, out) = support::run_keel("", &["workflow", "check", &path(&workflow)]);
    assert!(ok, "{out}");
    assert!(out.contains("\"repository\": \"acme/widgets\""), "{out}");
    let (ok, out) = support::run_keel(
        "",
        &[
            "workflow",
            "render",
            &path(&workflow),
            "--issue",
            &path(&issue_file),
            "--attempt",
            "3",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "Fix acme/widgets#7: broken (attempt 3)");
    let (ok, out) = support::run_keel("", &["workflow", "check", &path(&broken)]);
    assert!(
        !ok && out.contains("workflow_front_matter_not_a_map"),
        "{out}"
    );
    let missing = dir.path().join("nope.md");
    let (ok, out) = support::run_keel("", &["workflow", "check", &path(&missing)]);
    assert!(!ok && out.contains("missing_workflow_file"), "{out}");
}

/// A workflow polling `acme/widgets` on the local GitHub at `endpoint`.
fn github_workflow(endpoint: &str, interval_ms: u64) -> String {
    format!(
        "---
tracker:
  kind: github
  endpoint: {endpoint}
  repository: acme/widgets
  api_key: $ACME_GITHUB_TOKEN
polling:
  interval_ms: {interval_ms}
task:
  execution_kind: shell
  shell_command: echo imported
---
Work on {{{{ issue.identifier }}}}: {{{{ issue.title }}}}
"
    )
}

fn github_pull(number: u64) -> Value {
    json!({ "id": 2000 + number, "number": number, "title": format!("pull {number}"),
            "state": "open", "updated_at": "2026-11-30T09:30:00Z",
            "head": { "sha": "0123abc", "ref": "fix-branch" } })
}

async fn task_count(client: &Client) -> usize {
    let tasks = client.api.list_tasks(None).query("limit", Some(200));
    let (status, tasks) = tasks.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{tasks:?}");
    tasks.data.len()
}

/// A `keel api` on a fresh database with the GitHub token in its environment: its log
/// directory, database, process and client.
async fn api_with_token() -> (tempfile::TempDir, String, KeelProcess, Client) {
    let dir = tempfile::tempdir().unwrap();
    let db_url = support::fresh_database().await;
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &[TOKEN_ENV]).await;
    let client = api.client.clone().unwrap();
    (dir, db_url, api, client)
}

/// The source a registration answered with (sent raw: 201 and 200 tell a new source from
/// one registered already).
fn source_id(body: &Value) -> String {
    support::record::<SourceRecord>(body).id
}

/// Polls the source now; the poll answers 200 with what it did.
async fn polled(client: &Client, id: &str) -> PollSummary {
    let path = format!("/v1/external-work/sources/{id}/poll");
    let (status, body) = client.post(&path, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    support::record(&body)
}

/// The item with this identifier.
fn item<'a>(items: &'a [ItemRecord], identifier: &str) -> &'a ItemRecord {
    items
        .iter()
        .find(|i| i.identifier == identifier)
        .unwrap_or_else(|| panic!("no {identifier} in {items:?}"))
}

#[tokio::test]
async fn a_source_registers_once_and_reports_its_health() {
    let app = TestApp::api_only().await;
    let markdown = github_workflow("http://127.0.0.1:9", 30_000);
    let (status, first) = register(&app.client, &markdown).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let id = source_id(&first);
    let (status, again) = register(&app.client, &markdown).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(source_id(&again), id);
    let listed = app.client.api.list_sources().query("limit", Some(1));
    let (status, listed) = listed.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{listed:?}");
    assert_eq!(listed.data[0].id, id);
    assert!(!listed.has_more);

    let health = app.client.api.source_status(&id).send_with_status().await;
    let (status, health) = health.unwrap();
    assert_eq!(status, StatusCode::OK, "{health:?}");
    let health = health.data;
    assert!(health.workflow.valid, "{health:?}");
    assert_eq!(health.workflow.repository.as_deref(), Some("acme/widgets"));
    let secret = health.secret.as_ref().unwrap();
    assert_eq!(secret.r#ref, "env:ACME_GITHUB_TOKEN");
    assert!(!secret.configured, "{health:?}");
    assert_eq!(health.records.get("total"), Some(&0));
    assert!(!health.background.running);

    // Each error class refuses a registration with its type.
    for (markdown, expected) in [
        ("---\ntracker: [\n---\n", "workflow_parse_error"),
        ("---\n- a\n---\n", "workflow_front_matter_not_a_map"),
        ("{% if %}", "template_parse_error"),
        ("{{ issue.title | shout }}", "template_render_error"),
    ] {
        let (status, body) = register(&app.client, markdown).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["error"]["type"], expected, "{body}");
    }
    let missing = json!({ "workflow_path": "/nonexistent/WORKFLOW.md" });
    let (status, body) = app.client.post("/v1/external-work/sources", missing).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "missing_workflow_file");

    // A file-backed source that breaks later still answers its status, with the error.
    let file = app.data_dir.path().join("WORKFLOW.md");
    std::fs::write(&file, github_workflow("http://127.0.0.1:10", 30_000)).unwrap();
    let by_path = json!({ "workflow_path": file.to_str().unwrap() });
    let (status, body) = app.client.post("/v1/external-work/sources", by_path).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let file_id = source_id(&body);
    std::fs::write(&file, "---\n- broken\n---\n").unwrap();
    let health = app.client.api.source_status(&file_id).send_with_status();
    let (status, health) = health.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{health:?}");
    let health = health.data;
    assert!(!health.workflow.valid);
    assert_eq!(
        health.workflow.error.unwrap_or_default()["type"],
        "workflow_front_matter_not_a_map"
    );

    let (status, body) = app
        .client
        .delete(&format!("/v1/external-work/sources/{id}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = app
        .client
        .get(&format!("/v1/external-work/sources/{id}"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn github_polls_import_each_item_once_honour_etags_and_back_off_on_rate_limits() {
    let github = MockServer::start().await;
    // A second poll sends the ETags back: 304, nothing new.
    for (list, etag) in [("issues", "\"i1\""), ("pulls", "\"p1\"")] {
        Mock::given(method("GET"))
            .and(path(format!("/repos/acme/widgets/{list}")))
            .and(header("if-none-match", etag))
            .respond_with(ResponseTemplate::new(304))
            .with_priority(1)
            .mount(&github)
            .await;
    }
    // The issues list has pull requests too (with `pull_request`); the pulls list has them
    // with their head SHA.
    let mut pull_in_issues = github_issue(3, "open");
    pull_in_issues["pull_request"] = json!({ "url": "…" });
    let issues = json!([
        github_issue(1, "open"),
        github_issue(2, "closed"),
        pull_in_issues
    ]);
    list("issues", issues, "\"i1\"").mount(&github).await;
    list("pulls", json!([github_pull(3)]), "\"p1\"")
        .mount(&github)
        .await;

    let (dir, db_url, api, client) = api_with_token().await;
    let (status, body) = register(&client, &github_workflow(&github.uri(), 30_000)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = source_id(&body);

    let summary = polled(&client, &id).await;
    assert_eq!(summary.candidates, 3, "{summary:?}");
    assert_eq!(summary.claimed, 2, "{summary:?}");
    assert_eq!(summary.terminal, 1, "{summary:?}");
    assert_eq!(task_count(&client).await, 2);
    let items = items_of(&client, &id).await;
    let keys: Vec<&str> = items.iter().map(|i| i.idempotency_key.as_str()).collect();
    assert!(
        keys.contains(&"github:pull_request:acme/widgets:3:0123abc:2026-11-30T09:30:00Z"),
        "{keys:?}"
    );
    let claimed = item(&items, "acme/widgets#1");
    assert_eq!(claimed.state, ItemState::Claimed);
    assert_eq!(
        claimed.prompt.as_deref(),
        Some("Work on acme/widgets#1: issue 1")
    );
    let (task_id, run_id) = (
        claimed.task_id.as_deref().unwrap(),
        claimed.run_id.as_deref().unwrap(),
    );
    let task = client.api.get_task(task_id).await.unwrap().data;
    assert_eq!(
        task.prompt.as_deref(),
        Some("Work on acme/widgets#1: issue 1")
    );
    assert_eq!(task.status, TaskStatus::Queued, "{task:?}");
    // Named as the tracker names the item, not by its rendered prompt.
    assert_eq!(task.title, "acme/widgets#1: issue 1");
    let evidence = client
        .api
        .list_artifacts(task_id, run_id)
        .await
        .unwrap()
        .data;
    let names: Vec<&str> = evidence.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names.len(), 2, "{evidence:?}");
    assert!(names.contains(&"external_work_item.json") && names.contains(&"prompt.md"));
    let item_artifact = evidence
        .iter()
        .find(|a| a.name == "external_work_item.json")
        .unwrap();
    let item_json = client
        .artifact_text(task_id, run_id, &item_artifact.id)
        .await;
    let item_json: Value = serde_json::from_str(&item_json).unwrap();
    assert_eq!(item_json["identifier"], "acme/widgets#1", "{item_json}");
    assert_eq!(item_json["labels"], json!(["bug"]));

    // 304: nothing changes, and the ETags stay for the poll after.
    for _ in 0..2 {
        let summary = polled(&client, &id).await;
        assert!(summary.not_modified, "{summary:?}");
        assert_eq!(summary.candidates, 0);
    }
    assert_eq!(task_count(&client).await, 2);

    // A manual import of a known version is a duplicate; a new one becomes a task.
    let import = |payload: Value| {
        client.post(
            "/v1/external-work/import",
            json!({ "source_id": id, "payload": payload }),
        )
    };
    let webhook =
        json!({ "repository": { "full_name": "acme/widgets" }, "issue": github_issue(1, "open") });
    let (status, body) = import(webhook).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(support::record::<Imported>(&body).duplicate);
    let (status, body) = import(github_issue(4, "open")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let imported: Imported = support::record(&body);
    assert_eq!(imported.item.state, ItemState::Claimed);
    let (status, again) = import(github_issue(4, "open")).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        support::record::<Imported>(&again).item.id,
        imported.item.id
    );
    assert_eq!(task_count(&client).await, 3);
    let other_repo =
        json!({ "repository": { "full_name": "evil/repo" }, "issue": github_issue(5, "open") });
    let (status, body) = import(other_repo).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    // A 429 with Retry-After backs off: the source keeps working, and asks nothing more
    // of GitHub until then.
    github.reset().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "120"))
        .mount(&github)
        .await;
    let summary = polled(&client, &id).await;
    assert_eq!(
        summary.error_code.as_deref(),
        Some("rate_limited"),
        "{summary:?}"
    );
    assert!(summary.backoff_until.is_some(), "{summary:?}");
    let asked = github.received_requests().await.unwrap().len();
    let summary = polled(&client, &id).await;
    assert_eq!(summary.candidates, 0, "{summary:?}");
    assert_eq!(github.received_requests().await.unwrap().len(), asked);
    // Read as sent too: its bytes are searched for the token.
    let (health, raw) = client.api.source_status(&id).fetch().await.unwrap();
    let (health, raw) = (health.data, String::from_utf8_lossy(&raw).into_owned());
    assert!(health.workflow.valid);
    assert!(health.secret.as_ref().unwrap().configured, "{raw}");
    assert!(health.background.backoff_until.is_some(), "{raw}");
    assert_eq!(health.last_errors["poll"].code, "rate_limited", "{raw}");
    assert_eq!(health.records.get("claimed"), Some(&3), "{raw}");
    assert!(!raw.contains(CANARY));

    assert_eq!(rows_containing(&db_url, CANARY).await, Vec::<String>::new());
    drop(api);
    let log = std::fs::read_to_string(dir.path().join("api.log")).unwrap();
    assert!(!log.contains(CANARY), "the token is in the API log");
}

const LINEAR_CANARY: &str = "lin_api_canary_0badf00d";

/// A Linear source's workflow; `settings` (YAML lines) follow the tracker's own, so they
/// may add to it (indented) and then name other sections.
/// Seed 000's `events`: only the versions whose event the workflow names start work; the
/// others are recorded, `discovered` with why, and counted.
#[tokio::test]
async fn only_the_events_the_workflow_names_start_work() {
    let github = MockServer::start().await;
    list("issues", json!([github_issue(1, "open")]), "\"i1\"")
        .mount(&github)
        .await;
    list("pulls", json!([github_pull(3)]), "\"p1\"")
        .mount(&github)
        .await;
    let (_dir, _db_url, _api, client) = api_with_token().await;
    let markdown = github_workflow(&github.uri(), 30_000).replace(
        "  api_key: $ACME_GITHUB_TOKEN\n",
        "  api_key: $ACME_GITHUB_TOKEN\n  events: [pull_request.opened, pull_request.synchronize]\n",
    );
    let (status, body) = register(&client, &markdown).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = source_id(&body);

    let summary = polled(&client, &id).await;
    assert_eq!(
        (summary.claimed, summary.not_listened),
        (1, 1),
        "{summary:?}"
    );
    let items = items_of(&client, &id).await;
    assert_eq!(item(&items, "acme/widgets#3").state, ItemState::Claimed);
    let issue = item(&items, "acme/widgets#1");
    assert_eq!(issue.state, ItemState::Discovered);
    assert_eq!(issue.last_error_code.as_deref(), Some("event_not_listened"));
    assert!(
        issue
            .last_error
            .as_deref()
            .unwrap()
            .contains("issue.opened"),
        "{issue:?}"
    );
    assert_eq!(task_count(&client).await, 1);

    // An event no workflow names is refused at registration, the field named.
    let bad = markdown.replace("pull_request.synchronize", "pull_request.merged");
    let (status, body) = register(&client, &bad.replace("acme/widgets", "acme/other")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "workflow_parse_error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tracker.events"),
        "{body}"
    );
}

/// Symphony pages its state reads: an open issue that is not among the most recently
/// updated is still found, on a later page of the open ones (oldest first).
#[tokio::test]
async fn symphony_client_pages_state_reads() {
    let github = MockServer::start().await;
    let page = |query: &str, items: Value, next: Option<String>| {
        let mut answer = ResponseTemplate::new(200).set_body_json(items);
        if let Some(next) = next {
            answer = answer.insert_header("link", format!("<{next}>; rel=\"next\"").as_str());
        }
        Mock::given(method("GET"))
            .and(path("/repos/acme/widgets/issues"))
            .and(wiremock::matchers::query_param("state", query))
            .respond_with(answer)
    };
    // Recently updated: #1 only. Open, oldest first: #1, then on page 2 the long-quiet #60.
    page("all", json!([github_issue(1, "open")]), None)
        .mount(&github)
        .await;
    let second = format!("{}/repositories/9/issues?state=open&page=2", github.uri());
    page("open", json!([github_issue(1, "open")]), Some(second))
        .mount(&github)
        .await;
    Mock::given(method("GET"))
        .and(path("/repositories/9/issues"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([github_issue(60, "open")])))
        .mount(&github)
        .await;
    list("pulls", json!([]), "\"p1\"").mount(&github).await;
    let (_dir, _db_url, _api, client) = api_with_token().await;
    let (status, body) = register(&client, &github_workflow(&github.uri(), 30_000)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = source_id(&body);
    let summary = polled(&client, &id).await;
    // #1 once, though two lists have it; #60 from the second page.
    assert_eq!((summary.candidates, summary.claimed), (2, 2), "{summary:?}");
    let items = items_of(&client, &id).await;
    assert_eq!(item(&items, "acme/widgets#60").state, ItemState::Claimed);
}

/// Symphony keeps the last known good configuration when a reload fails: a
/// `workflow_path` file an edit breaks leaves polls running on its last good version, the
/// error on the source, until it parses again.
#[tokio::test]
async fn symphony_an_invalid_workflow_reload_keeps_the_last_good_config() {
    let github = MockServer::start().await;
    list("issues", json!([github_issue(1, "open")]), "\"i1\"")
        .mount(&github)
        .await;
    list("pulls", json!([]), "\"p1\"").mount(&github).await;
    let (dir, _db_url, _api, client) = api_with_token().await;
    let file = dir.path().join("WORKFLOW.md");
    std::fs::write(&file, github_workflow(&github.uri(), 30_000)).unwrap();
    let body = json!({ "workflow_path": file.to_str().unwrap() });
    let (status, body) = client.post("/v1/external-work/sources", body).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = source_id(&body);
    assert_eq!(polled(&client, &id).await.claimed, 1);

    std::fs::write(&file, "---\ntracker: [not, a, map\n---\nbroken").unwrap();
    let summary = polled(&client, &id).await;
    assert_eq!(
        summary.error_code.as_deref(),
        Some("workflow_parse_error"),
        "{summary:?}"
    );
    let error = summary.error.as_deref().unwrap();
    assert!(
        error.contains("the last version of the file that parsed"),
        "{error}"
    );
    // The pass ran on the last good version: the tracker was asked, the item seen again.
    assert_eq!(
        (summary.candidates, summary.duplicates),
        (1, 1),
        "{summary:?}"
    );
    let status = client.api.source_status(&id).await.unwrap().data;
    assert!(!status.workflow.valid, "{status:?}");

    std::fs::write(&file, github_workflow(&github.uri(), 30_000)).unwrap();
    let summary = polled(&client, &id).await;
    assert_eq!(summary.error_code, None, "{summary:?}");
}

fn linear_workflow(endpoint: &str, settings: &str) -> String {
    format!(
        "---
tracker:
  kind: linear
  endpoint: {endpoint}
  project_slug: eng
  api_key: $ACME_LINEAR_API_KEY
{settings}task:
  execution_kind: shell
  shell_command: echo imported
---
Work on {{{{ issue.identifier }}}} ({{{{ issue.state }}}}), blocked by {{{{ issue.blocked_by.size }}}}
"
    )
}

fn linear_issue(number: u64, state: &str) -> Value {
    json!({ "id": format!("uuid-{number}"), "identifier": format!("ENG-{number}"),
            "title": format!("issue {number}"), "priority": 1, "state": { "name": state },
            "updatedAt": "2026-11-30T10:00:00.000Z", "labels": { "nodes": [] },
            "inverseRelations": { "nodes": [] } })
}

/// One page of the project's issues, answering the query whose `after` is `after`.
fn linear_page(after: Value, nodes: Value, next: Option<&str>) -> Mock {
    held_linear_page(after, nodes, next, Duration::ZERO)
}

/// [`linear_page`], answered only after `delay`.
fn held_linear_page(after: Value, nodes: Value, next: Option<&str>, delay: Duration) -> Mock {
    let query = json!({ "variables": { "projectSlug": "eng", "after": after } });
    let page = json!({ "data": { "issues": { "nodes": nodes,
        "pageInfo": { "hasNextPage": next.is_some(), "endCursor": next } } } });
    Mock::given(method("POST"))
        .and(path("/graphql"))
        .and(header("authorization", LINEAR_CANARY))
        .and(body_partial_json(query))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(page)
                .set_delay(delay),
        )
}

/// The answer to reconciliation's question about the issues with these ids.
fn linear_by_ids(ids: Value, nodes: Value) -> Mock {
    let page = json!({ "data": { "issues": { "nodes": nodes,
        "pageInfo": { "hasNextPage": false, "endCursor": null } } } });
    Mock::given(method("POST"))
        .and(path("/graphql"))
        .and(header("authorization", LINEAR_CANARY))
        .and(body_partial_json(json!({ "variables": { "ids": ids } })))
        .respond_with(ResponseTemplate::new(200).set_body_json(page))
}

/// A `keel api` (no worker) with the Linear key, and a source registered on `linear`.
struct LinearSource {
    dir: tempfile::TempDir,
    db_url: String,
    api: support::KeelProcess,
    client: Client,
    id: String,
}

async fn linear_source(linear: &MockServer) -> LinearSource {
    linear_source_with(linear, "").await
}

/// [`linear_source`] with more `settings` ([`linear_workflow`]).
async fn linear_source_with(linear: &MockServer, settings: &str) -> LinearSource {
    let dir = tempfile::tempdir().unwrap();
    let db_url = support::fresh_database().await;
    let env = [("ACME_LINEAR_API_KEY", LINEAR_CANARY)];
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &env).await;
    let client = api.client.clone().unwrap();
    let endpoint = format!("{}/graphql", linear.uri());
    let (status, body) = register(&client, &linear_workflow(&endpoint, settings)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = source_id(&body);
    LinearSource {
        dir,
        db_url,
        api,
        client,
        id,
    }
}

#[tokio::test]
async fn linear_polls_page_through_the_project_import_each_issue_once_and_back_off() {
    let linear = MockServer::start().await;
    let mut with_blocker = linear_issue(3, "In Progress");
    with_blocker["inverseRelations"]["nodes"] = json!([{ "type": "blocks",
        "issue": { "id": "uuid-1", "identifier": "ENG-1", "state": { "name": "Todo" } } }]);
    linear_page(
        Value::Null,
        json!([linear_issue(1, "Todo"), linear_issue(2, "Todo")]),
        Some("cursor-2"),
    )
    .mount(&linear)
    .await;
    linear_page(json!("cursor-2"), json!([with_blocker]), None)
        .mount(&linear)
        .await;

    let LinearSource {
        dir,
        db_url,
        api,
        client,
        id,
    } = linear_source(&linear).await;

    let summary = polled(&client, &id).await;
    assert_eq!(summary.candidates, 3, "{summary:?}");
    assert_eq!(summary.error_code, None, "{summary:?}");
    assert_eq!(linear.received_requests().await.unwrap().len(), 2);
    let items = items_of(&client, &id).await;
    let third = item(&items, "ENG-3");
    assert_eq!(
        third.idempotency_key,
        "linear:issue:eng:ENG-3:2026-11-30T10:00:00.000Z"
    );
    assert_eq!(
        third.prompt.as_deref(),
        Some("Work on ENG-3 (In Progress), blocked by 1")
    );
    assert_eq!(summary.claimed, 3, "{summary:?}");
    let tasks = task_count(&client).await;
    assert_eq!(tasks, 3, "{items:?}");

    // The same versions again: duplicates, nothing new.
    let summary = polled(&client, &id).await;
    assert_eq!(summary.duplicates, 3, "{summary:?}");
    assert_eq!(task_count(&client).await, tasks);

    // A webhook payload of a new version goes through the same import.
    let mut changed = linear_issue(1, "Todo");
    changed["updatedAt"] = json!("2026-11-30T11:00:00.000Z");
    let webhook = json!({ "action": "update", "type": "Issue", "data": changed });
    let (status, body) = client
        .post(
            "/v1/external-work/import",
            json!({ "source_id": id, "payload": webhook }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(!support::record::<Imported>(&body).duplicate, "{body}");
    // ENG-1 already has its task: the new version is recorded, no second task.
    assert_eq!(task_count(&client).await, tasks);

    // Every document sent so far is one Linear's schema takes.
    support::contracts::assert_linear_conforms(&linear.received_requests().await.unwrap());

    // Linear's RATELIMITED error backs off until its reset, without failing the source.
    linear.reset().await;
    let reset = chrono::Utc::now() + chrono::Duration::minutes(2);
    let limited = json!({ "errors": [{ "message": "Rate limit exceeded",
        "extensions": { "code": "RATELIMITED" } }] });
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(400)
                .insert_header("x-ratelimit-requests-remaining", "0")
                .insert_header(
                    "x-ratelimit-requests-reset",
                    reset.timestamp_millis().to_string().as_str(),
                )
                .set_body_json(limited),
        )
        .mount(&linear)
        .await;
    let summary = polled(&client, &id).await;
    assert_eq!(
        summary.error_code.as_deref(),
        Some("rate_limited"),
        "{summary:?}"
    );
    let until = summary.backoff_until.unwrap();
    assert_eq!(until.timestamp(), reset.timestamp(), "{summary:?}");
    let asked = linear.received_requests().await.unwrap().len();
    let summary = polled(&client, &id).await;
    assert_eq!(summary.candidates, 0, "{summary:?}");
    assert_eq!(linear.received_requests().await.unwrap().len(), asked);

    assert_eq!(
        rows_containing(&db_url, LINEAR_CANARY).await,
        Vec::<String>::new()
    );
    drop(api);
    let log = std::fs::read_to_string(dir.path().join("api.log")).unwrap();
    assert!(!log.contains(LINEAR_CANARY), "the key is in the API log");
}

/// ENG-1 and ENG-2 in Todo on a Linear stand-in, and a source polled once: both claimed.
/// No worker: their runs stay queued, which is active.
async fn two_claimed() -> (MockServer, LinearSource) {
    let linear = MockServer::start().await;
    let page = json!([linear_issue(1, "Todo"), linear_issue(2, "Todo")]);
    linear_page(Value::Null, page, None).mount(&linear).await;
    let source = linear_source(&linear).await;
    let summary = polled(&source.client, &source.id).await;
    assert_eq!(summary.claimed, 2, "{summary:?}");
    (linear, source)
}

#[tokio::test]
async fn an_item_that_leaves_the_active_states_has_its_run_cancelled() {
    let (linear, source) = two_claimed().await;
    let (client, id) = (source.client.clone(), source.id.clone());
    let items = items_of(&client, &id).await;
    let one = item(&items, "ENG-1");

    // ENG-1 moved to Done: the active query no longer has it, the question by id does.
    linear.reset().await;
    linear_page(Value::Null, json!([linear_issue(2, "Todo")]), None)
        .mount(&linear)
        .await;
    let mut done = linear_issue(1, "Done");
    done["updatedAt"] = json!("2026-11-30T12:00:00.000Z");
    linear_by_ids(json!(["uuid-1"]), json!([done]))
        .mount(&linear)
        .await;
    let summary = polled(&client, &id).await;
    assert_eq!(summary.error_code, None, "{summary:?}");
    assert_eq!(summary.cancelled_runs, 1, "{summary:?}");
    assert_eq!(summary.terminal, 1, "{summary:?}");
    assert_eq!(summary.duplicates, 1, "{summary:?}");
    let run = run_of(&client, one).await;
    assert_eq!(run.status, RunStatus::Cancelled, "{run:?}");
    let reason = run.last_error.as_deref().unwrap();
    assert!(reason.contains("ENG-1 left the active states"), "{reason}");
    // ENG-2's run goes on.
    let two = item(&items, "ENG-2");
    assert_eq!(run_of(&client, two).await.status, RunStatus::Queued);
    // The question by id is one Linear's schema takes.
    support::contracts::assert_linear_conforms(&linear.received_requests().await.unwrap());
}

/// A Linear issue with these labels.
fn labelled(number: u64, labels: &[&str]) -> Value {
    let mut issue = linear_issue(number, "Todo");
    let nodes: Vec<Value> = labels.iter().map(|name| json!({ "name": name })).collect();
    issue["labels"]["nodes"] = json!(nodes);
    issue
}

/// A Linear source with `settings` over `page` (ENG-1 to ENG-3) is polled: only ENG-1 is
/// worked on, the others are recorded with no task. Then ENG-1's next version, `changed`
/// (given a new `updatedAt`), is one the workflow does not want: its run is stopped with a
/// reason that says `why`. Every document sent is one Linear's schema takes.
async fn only_eng_1_is_worked_on_until_its_next_version(
    settings: &str,
    page: Value,
    mut changed: Value,
    why: &str,
) {
    let linear = MockServer::start().await;
    linear_page(Value::Null, page, None).mount(&linear).await;
    let source = linear_source_with(&linear, settings).await;
    let (client, id) = (source.client.clone(), source.id.clone());
    let summary = polled(&client, &id).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");
    assert_eq!(task_count(&client).await, 1);
    let items = items_of(&client, &id).await;
    assert_eq!(item(&items, "ENG-1").state, ItemState::Claimed, "{items:?}");
    for unwanted in ["ENG-2", "ENG-3"] {
        let found = item(&items, unwanted);
        assert_eq!(found.state, ItemState::Discovered, "{found:?}");
        assert_eq!(found.task_id, None, "{found:?}");
    }

    linear.reset().await;
    changed["updatedAt"] = json!("2026-11-30T12:00:00.000Z");
    linear_page(Value::Null, json!([changed]), None)
        .mount(&linear)
        .await;
    let summary = polled(&client, &id).await;
    assert_eq!(summary.cancelled_runs, 1, "{summary:?}");
    let run = run_of(&client, item(&items, "ENG-1")).await;
    assert_eq!(run.status, RunStatus::Cancelled, "{run:?}");
    let reason = run.last_error.as_deref().unwrap_or_default();
    assert!(reason.contains(why), "{reason}");
    support::contracts::assert_linear_conforms(&linear.received_requests().await.unwrap());
}

/// Symphony: "issue without every required label is not dispatch-eligible", and
/// "reconcile stops running issue when a required label is removed". Labels compare
/// trimmed and without case. ENG-1 then loses its backend label.
#[tokio::test]
async fn symphony_issue_without_every_required_label_is_not_dispatch_eligible() {
    let page = json!([
        labelled(1, &["Ready", "backend"]),
        labelled(2, &["ready"]),
        labelled(3, &[])
    ]);
    let settings = "  required_labels: [' ready ', Backend]\n";
    let relabelled = labelled(1, &["ready"]);
    let why = "no longer carries every required label";
    only_eng_1_is_worked_on_until_its_next_version(settings, page, relabelled, why).await;
}

/// A Linear issue assigned to `user` (none: unassigned).
fn assigned(number: u64, user: Option<&str>) -> Value {
    let mut issue = linear_issue(number, "Todo");
    issue["assignee"] = user.map_or(Value::Null, |id| json!({ "id": id, "isMe": false }));
    issue
}

/// Symphony: "issue assigned to another worker is not dispatch-eligible", and "reconcile
/// stops running issue when it is reassigned away from this worker". ENG-1 is then
/// reassigned to user-2.
#[tokio::test]
async fn symphony_reconcile_stops_running_issue_when_it_is_reassigned_away_from_this_worker() {
    let page = json!([
        assigned(1, Some("user-1")),
        assigned(2, Some("user-2")),
        assigned(3, None)
    ]);
    let reassigned = assigned(1, Some("user-2"));
    let settings = "  assignee: user-1\n";
    only_eng_1_is_worked_on_until_its_next_version(
        settings,
        page,
        reassigned,
        "no longer assigned",
    )
    .await;
}

/// A Linear issue with this priority (0: none) and creation time.
fn prioritized(number: u64, priority: i64, created_at: &str) -> Value {
    let mut issue = linear_issue(number, "Todo");
    issue["priority"] = json!(priority);
    issue["createdAt"] = json!(created_at);
    issue
}

/// Cancels the run of the item `identifier`, freeing its slot.
async fn cancel_run_of(client: &Client, id: &str, identifier: &str) {
    let items = items_of(client, id).await;
    let claimed = item(&items, identifier);
    let (task_id, run_id) = (claimed.task_id.as_deref(), claimed.run_id.as_deref());
    let path = format!(
        "/v1/tasks/{}/runs/{}/cancel",
        task_id.unwrap(),
        run_id.unwrap()
    );
    let (status, body) = client.post_empty(&path).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// The identifiers of the source's items that have a task, in the order they got one.
async fn started_order(client: &Client, id: &str) -> Vec<String> {
    let mut items: Vec<ItemRecord> = items_of(client, id)
        .await
        .into_iter()
        .filter(|i| i.task_id.is_some())
        .collect();
    items.sort_by_key(|i| i.task_id.clone());
    let mut order: Vec<String> = items.into_iter().map(|i| i.identifier).collect();
    order.dedup();
    order
}

/// Symphony: "orchestrator sorts dispatch by priority then oldest created_at". One slot:
/// the urgent and oldest item takes it whatever the tracker's order, and the waiting items
/// start in the same order as slots free.
#[tokio::test]
async fn symphony_orchestrator_sorts_dispatch_by_priority_then_oldest_created_at() {
    let linear = MockServer::start().await;
    let page = json!([
        prioritized(1, 3, "2026-01-01T00:00:00.000Z"),
        prioritized(2, 1, "2026-03-01T00:00:00.000Z"),
        prioritized(3, 1, "2026-02-01T00:00:00.000Z"),
        prioritized(4, 0, "2025-01-01T00:00:00.000Z")
    ]);
    linear_page(Value::Null, page, None).mount(&linear).await;
    let settings = "agent:\n  max_concurrent_agents: 1\n";
    let source = linear_source_with(&linear, settings).await;
    let (client, id) = (source.client.clone(), source.id.clone());
    let summary = polled(&client, &id).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");
    assert_eq!(started_order(&client, &id).await, ["ENG-3"]);
    for (ended, expected) in [
        ("ENG-3", vec!["ENG-3", "ENG-2"]),
        ("ENG-2", vec!["ENG-3", "ENG-2", "ENG-1"]),
        ("ENG-1", vec!["ENG-3", "ENG-2", "ENG-1", "ENG-4"]),
    ] {
        cancel_run_of(&client, &id, ended).await;
        let summary = polled(&client, &id).await;
        assert_eq!(summary.claimed, 1, "{summary:?}");
        assert_eq!(started_order(&client, &id).await, expected);
    }
}

/// ENG-1 and ENG-2 in Todo on a Linear stand-in, and a source with `settings` (which
/// leave one slot) polled once: ENG-1 takes the slot, ENG-2 waits.
async fn one_slot_for_two(settings: &str) -> (MockServer, LinearSource) {
    let linear = MockServer::start().await;
    let page = json!([linear_issue(1, "Todo"), linear_issue(2, "Todo")]);
    linear_page(Value::Null, page, None).mount(&linear).await;
    let source = linear_source_with(&linear, settings).await;
    let summary = polled(&source.client, &source.id).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");
    assert_eq!(started_order(&source.client, &source.id).await, ["ENG-1"]);
    (linear, source)
}

/// Symphony: "config supports per-state max concurrent agent overrides", counted by the
/// state an item is in now: a running item that moved from Todo to In Progress frees its
/// Todo slot.
#[tokio::test]
async fn symphony_config_supports_per_state_max_concurrent_agent_overrides() {
    let settings = "agent:\n  max_concurrent_agents_by_state:\n    todo: 1\n";
    let (linear, source) = one_slot_for_two(settings).await;
    let (client, id) = (source.client.clone(), source.id.clone());
    let items = items_of(&client, &id).await;
    let waiting = item(&items, "ENG-2");
    assert_eq!(
        waiting.last_error_code.as_deref(),
        Some("no_free_slot"),
        "{waiting:?}"
    );

    // ENG-1 (its run still queued) moves on to In Progress: Todo has room again.
    linear.reset().await;
    let mut moved = linear_issue(1, "In Progress");
    moved["updatedAt"] = json!("2026-11-30T12:00:00.000Z");
    let page = json!([moved, linear_issue(2, "Todo")]);
    linear_page(Value::Null, page, None).mount(&linear).await;
    let summary = polled(&client, &id).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");
    assert_eq!(started_order(&client, &id).await, ["ENG-1", "ENG-2"]);
    let run = run_of(&client, item(&items, "ENG-1")).await;
    assert_eq!(
        run.status,
        RunStatus::Queued,
        "ENG-1's run goes on: {run:?}"
    );
}

/// Symphony: "dispatch revalidation skips an issue when provider routing changes". An
/// item waiting for a slot is asked about again before it starts: one that went Done
/// meanwhile (out of the active list, so only a question by id shows it) never starts.
#[tokio::test]
async fn symphony_dispatch_revalidation_skips_an_issue_when_provider_routing_changes() {
    let (linear, source) = one_slot_for_two("agent:\n  max_concurrent_agents: 1\n").await;
    let (client, id) = (source.client.clone(), source.id.clone());

    // ENG-2 went Done while it waited; ENG-1's run ends, freeing the slot.
    linear.reset().await;
    linear_page(Value::Null, json!([]), None)
        .mount(&linear)
        .await;
    let mut done = linear_issue(2, "Done");
    done["updatedAt"] = json!("2026-11-30T12:00:00.000Z");
    linear_by_ids(json!(["uuid-2"]), json!([done]))
        .mount(&linear)
        .await;
    cancel_run_of(&client, &id, "ENG-1").await;
    let summary = polled(&client, &id).await;
    assert_eq!(summary.claimed, 0, "{summary:?}");
    assert_eq!(summary.terminal, 1, "{summary:?}");
    assert_eq!(task_count(&client).await, 1);
    let items = items_of(&client, &id).await;
    let newest = items.iter().rfind(|i| i.identifier == "ENG-2").unwrap();
    assert_eq!(newest.state, ItemState::Terminal, "{items:?}");
}

/// Symphony: "missing running issues stop active agents without cleaning the
/// workspace". An item the tracker no longer shows (asked by id, absent from the answer)
/// has its run stopped; it is not ended, so nothing removes its workspace.
#[tokio::test]
async fn symphony_missing_running_issues_stop_active_agents_without_cleaning_the_workspace() {
    let (linear, source) = two_claimed().await;
    let (client, id) = (source.client.clone(), source.id.clone());
    let items = items_of(&client, &id).await;

    // ENG-1 is gone from the project: neither the list nor the question by id has it.
    linear.reset().await;
    linear_page(Value::Null, json!([linear_issue(2, "Todo")]), None)
        .mount(&linear)
        .await;
    linear_by_ids(json!(["uuid-1"]), json!([]))
        .mount(&linear)
        .await;
    let summary = polled(&client, &id).await;
    assert_eq!(summary.error_code, None, "{summary:?}");
    assert_eq!(summary.cancelled_runs, 1, "{summary:?}");
    let run = run_of(&client, item(&items, "ENG-1")).await;
    assert_eq!(run.status, RunStatus::Cancelled, "{run:?}");
    let reason = run.last_error.as_deref().unwrap_or_default();
    assert!(
        reason.contains("no longer shown by the tracker"),
        "{reason}"
    );
    let now = items_of(&client, &id).await;
    let one = now.iter().rfind(|i| i.identifier == "ENG-1").unwrap();
    assert_ne!(one.state, ItemState::Terminal, "{one:?}");
    assert_eq!(
        run_of(&client, item(&items, "ENG-2")).await.status,
        RunStatus::Queued
    );
}

/// The same on GitHub, whose lists show every state: a poll asks by id for the claimed
/// items its lists did not show, so a deleted issue's run is stopped, not left to run or to
/// be retried.
#[tokio::test]
async fn a_deleted_github_issue_has_its_run_stopped_by_the_next_poll() {
    let github = MockServer::start().await;
    list("issues", json!([github_issue(1, "open")]), "\"v1\"")
        .mount(&github)
        .await;
    list("pulls", json!([]), "\"p1\"").mount(&github).await;
    let (_dir, _db, _api, client) = api_with_token().await;
    let (status, body) = register(&client, &github_workflow(&github.uri(), 30_000)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = source_id(&body);
    assert_eq!(polled(&client, &id).await.claimed, 1);
    let items = items_of(&client, &id).await;

    // The issue is deleted: the lists no longer have it, and asked by id GitHub says 410.
    github.reset().await;
    list("issues", json!([]), "\"v2\"").mount(&github).await;
    list("pulls", json!([]), "\"p1\"").mount(&github).await;
    Mock::given(method("GET"))
        .and(path("/repos/acme/widgets/issues/1"))
        .respond_with(ResponseTemplate::new(410))
        .mount(&github)
        .await;
    let summary = polled(&client, &id).await;
    assert_eq!(summary.error_code, None, "{summary:?}");
    assert_eq!(summary.cancelled_runs, 1, "{summary:?}");
    let run = run_of(&client, item(&items, "acme/widgets#1")).await;
    assert_eq!(run.status, RunStatus::Cancelled, "{run:?}");
    support::contracts::assert_github_conforms(&github.received_requests().await.unwrap());
}

#[tokio::test]
async fn a_todo_issue_waits_for_its_blockers_to_finish() {
    let linear = MockServer::start().await;
    let blocked_by = |state: &str| {
        let mut issue = linear_issue(5, "Todo");
        issue["inverseRelations"]["nodes"] = json!([{ "type": "blocks",
            "issue": { "id": "uuid-4", "identifier": "ENG-4", "state": { "name": state } } }]);
        issue
    };
    let first = json!([linear_issue(4, "In Progress"), blocked_by("In Progress")]);
    linear_page(Value::Null, first, None).mount(&linear).await;
    let source = linear_source(&linear).await;
    let (client, id) = (source.client.clone(), source.id.clone());
    let summary = polled(&client, &id).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");
    let items = items_of(&client, &id).await;
    let five = item(&items, "ENG-5");
    assert_eq!(five.state, ItemState::Discovered, "{five:?}");
    assert_eq!(
        five.last_error_code.as_deref(),
        Some("blocked_by_open_issues"),
        "{five:?}"
    );
    assert!(
        five.last_error.as_deref().unwrap().contains("ENG-4"),
        "{five:?}"
    );

    // ENG-4 is done; ENG-5's version is the same, its blocker's state is not.
    linear.reset().await;
    linear_page(Value::Null, json!([blocked_by("Done")]), None)
        .mount(&linear)
        .await;
    let mut done = linear_issue(4, "Done");
    done["updatedAt"] = json!("2026-11-30T12:00:00.000Z");
    linear_by_ids(json!(["uuid-4"]), json!([done]))
        .mount(&linear)
        .await;
    let summary = polled(&client, &id).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");
    assert_eq!(summary.cancelled_runs, 1, "{summary:?}");
    let items = items_of(&client, &id).await;
    let five = item(&items, "ENG-5");
    assert_eq!(five.state, ItemState::Claimed, "{five:?}");
    assert_eq!(task_count(&client).await, 2);
}

#[tokio::test]
async fn reconcile_asks_github_for_the_items_with_active_runs_only() {
    let github = MockServer::start().await;
    list("issues", json!([github_issue(1, "open")]), "\"i1\"")
        .mount(&github)
        .await;
    list("pulls", json!([]), "\"p1\"").mount(&github).await;
    let (_dir, _db_url, _api, client) = api_with_token().await;
    let (_, body) = register(&client, &github_workflow(&github.uri(), 30_000)).await;
    let id = source_id(&body);
    let summary = polled(&client, &id).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");

    github.reset().await;
    let mut closed = github_issue(1, "closed");
    closed["updated_at"] = json!("2026-11-30T12:00:00Z");
    Mock::given(method("GET"))
        .and(path("/repos/acme/widgets/issues/1"))
        .and(header("authorization", format!("Bearer {CANARY}").as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(closed))
        .mount(&github)
        .await;
    let reconcile = format!("/v1/external-work/sources/{id}/reconcile");
    let (status, body) = client.post_empty(&reconcile).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        support::record::<PollSummary>(&body).cancelled_runs,
        1,
        "{body}"
    );
    // One question, about the one item; the lists were not asked for.
    let asked = github.received_requests().await.unwrap();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let items = items_of(&client, &id).await;
    let claimed = items
        .iter()
        .find(|i| i.state == ItemState::Claimed)
        .unwrap();
    assert_eq!(run_of(&client, claimed).await.status, RunStatus::Cancelled);
    // Nothing is active any more: a second reconciliation asks nothing.
    let (_, body) = client.post_empty(&reconcile).await;
    assert_eq!(
        support::record::<PollSummary>(&body).candidates,
        0,
        "{body}"
    );
    assert_eq!(github.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn max_concurrent_agents_holds_items_back_until_a_slot_frees() {
    let github = MockServer::start().await;
    let issues = json!([github_issue(1, "open"), github_issue(2, "open")]);
    list("issues", issues, "\"i1\"").mount(&github).await;
    list("pulls", json!([]), "\"p1\"").mount(&github).await;
    let (_dir, _db_url, _api, client) = api_with_token().await;
    let markdown = github_workflow(&github.uri(), 30_000).replacen(
        "polling:",
        "agent:\n  max_concurrent_agents: 1\npolling:",
        1,
    );
    let (status, body) = register(&client, &markdown).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = source_id(&body);
    let summary = polled(&client, &id).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");
    assert_eq!(summary.discovered, 1, "{summary:?}");
    assert_eq!(task_count(&client).await, 1);
    let items = items_of(&client, &id).await;
    let in_state = |state: ItemState| items.iter().find(|i| i.state == state).unwrap();
    let waiting = in_state(ItemState::Discovered);
    assert_eq!(
        waiting.last_error_code.as_deref(),
        Some("no_free_slot"),
        "{waiting:?}"
    );
    let claimed = in_state(ItemState::Claimed);

    // Still full: the next poll starts nothing.
    let summary = polled(&client, &id).await;
    assert_eq!(summary.claimed, 0, "{summary:?}");
    // The first run ends: the next poll starts the waiting item, from what it stored.
    let (task_id, run_id) = (
        claimed.task_id.as_deref().unwrap(),
        claimed.run_id.as_deref().unwrap(),
    );
    let (status, body) = client
        .post_empty(&format!("/v1/tasks/{task_id}/runs/{run_id}/cancel"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let summary = polled(&client, &id).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");
    assert_eq!(task_count(&client).await, 2);
    let items = items_of(&client, &id).await;
    let started = items.iter().find(|i| i.id == waiting.id).unwrap();
    assert_eq!(started.state, ItemState::Claimed, "{started:?}");
    assert_eq!(started.last_error_code, None, "{started:?}");
}

#[tokio::test]
async fn a_failed_run_of_an_active_item_is_retried_with_its_attempt_rendered() {
    let github = MockServer::start().await;
    list("issues", json!([github_issue(1, "open")]), "\"i1\"")
        .mount(&github)
        .await;
    list("pulls", json!([]), "\"p1\"").mount(&github).await;
    let (dir, db_url, _api, client) = api_with_token().await;
    let data = dir.path().join("worker");
    std::fs::create_dir_all(&data).unwrap();
    let _worker = support::spawn_worker(&db_url, dir.path(), "worker", 2_000, &data);
    // The run succeeds only when its prompt says it is retry 1.
    let markdown = format!(
        "---
tracker:
  kind: github
  endpoint: {}
  repository: acme/widgets
  api_key: $ACME_GITHUB_TOKEN
agent:
  max_retry_backoff_ms: 1
task:
  execution_kind: shell
  shell_command: test \"$KEEL_RUN_PROMPT\" = \"Try 1\"
---
Try {{% if attempt %}}{{{{ attempt }}}}{{% else %}}0{{% endif %}}
",
        github.uri()
    );
    let (status, body) = register(&client, &markdown).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = source_id(&body);
    let summary = polled(&client, &id).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");
    let first = items_of(&client, &id).await[0].clone();
    let (task_id, run_id) = (
        first.task_id.as_deref().unwrap(),
        first.run_id.as_deref().unwrap(),
    );
    let failed = client
        .wait_terminal(task_id, run_id, Duration::from_secs(30))
        .await;
    assert_eq!(failed.status, RunStatus::Failed, "{failed:?}");

    let summary = polled(&client, &id).await;
    assert_eq!(summary.retried, 1, "{summary:?}");
    let item = items_of(&client, &id).await[0].clone();
    assert_eq!(item.state, ItemState::Claimed, "{item:?}");
    assert_eq!(item.prompt.as_deref(), Some("Try 1"), "{item:?}");
    let retry_id = item.run_id.as_deref().unwrap();
    assert_ne!(retry_id, run_id);
    let retried = client
        .wait_terminal(task_id, retry_id, Duration::from_secs(30))
        .await;
    assert_eq!(retried.status, RunStatus::Completed, "{retried:?}");
    assert_eq!(
        retried.retried_from_run_id.as_deref(),
        Some(run_id),
        "{retried:?}"
    );
    // Completed: nothing more to retry.
    let summary = polled(&client, &id).await;
    assert_eq!(summary.retried, 0, "{summary:?}");
}

#[tokio::test]
async fn two_workers_polling_one_source_in_the_background_create_each_task_once() {
    let github = MockServer::start().await;
    // No ETags: every poll reads every item again, and each is a duplicate after the first.
    let issues = json!([
        github_issue(1, "open"),
        github_issue(2, "open"),
        github_issue(3, "open")
    ]);
    Mock::given(method("GET"))
        .and(path("/repos/acme/widgets/issues"))
        .respond_with(ResponseTemplate::new(200).set_body_json(issues))
        .mount(&github)
        .await;
    Mock::given(method("GET"))
        .and(path("/repos/acme/widgets/pulls"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&github)
        .await;
    let (dir, db_url, _api, client) = api_with_token().await;
    let workers: Vec<_> = ["worker-a", "worker-b"]
        .iter()
        .map(|name| {
            let data = dir.path().join(name);
            std::fs::create_dir_all(&data).unwrap();
            support::spawn_worker_with_env(&db_url, dir.path(), name, 2_000, &data, &[TOKEN_ENV])
        })
        .collect();
    let (status, body) = register(&client, &github_workflow(&github.uri(), 100)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = source_id(&body);
    let background = format!("/v1/external-work/sources/{id}/background");
    let (status, body) = client.post(&background, json!({ "enabled": true })).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Many polls, by both workers over time, each reading all three items.
    wait_for(Duration::from_secs(30), "ten background polls", || async {
        let lists = github.received_requests().await.unwrap().len();
        (lists >= 20).then_some(())
    })
    .await;
    assert_eq!(task_count(&client).await, 3);
    let health = client.api.source_status(&id).await.unwrap().data;
    assert_eq!(health.records.get("total"), Some(&3), "{health:?}");
    assert!(health.background.running);
    assert!(health.last_errors.is_empty(), "{health:?}");

    // Stopped: the polls end.
    let (status, body) = client.post(&background, json!({ "enabled": false })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let pool = support::pool(&db_url).await;
    wait_for(Duration::from_secs(10), "the poll job to end", || async {
        let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM queue_jobs WHERE kind = 'poll'")
            .fetch_one(&pool)
            .await
            .unwrap();
        (jobs == 0).then_some(())
    })
    .await;

    assert_eq!(rows_containing(&db_url, CANARY).await, Vec::<String>::new());
    for mut worker in workers {
        worker.terminate(Duration::from_secs(10));
        assert!(
            !worker.log_text().contains(CANARY),
            "the token is in a worker's log"
        );
    }
}

#[tokio::test]
async fn a_worker_killed_mid_poll_loses_nothing_and_duplicates_nothing() {
    let github = MockServer::start().await;
    // Slow enough that the first worker is still waiting on it when it is killed.
    let issues = json!([github_issue(1, "open"), github_issue(2, "open")]);
    Mock::given(method("GET"))
        .and(path("/repos/acme/widgets/issues"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(issues)
                .set_delay(Duration::from_secs(2)),
        )
        .mount(&github)
        .await;
    Mock::given(method("GET"))
        .and(path("/repos/acme/widgets/pulls"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&github)
        .await;
    let (dir, db_url, _api, client) = api_with_token().await;
    let worker = |name: &str| {
        let data = dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        support::spawn_worker_with_env(&db_url, dir.path(), name, 1_000, &data, &[TOKEN_ENV])
    };
    let mut first = worker("worker-a");
    let (_, body) = register(&client, &github_workflow(&github.uri(), 100)).await;
    let id = source_id(&body);
    let background = format!("/v1/external-work/sources/{id}/background");
    let (status, body) = client.post(&background, json!({ "enabled": true })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    wait_for(
        Duration::from_secs(20),
        "the first worker to be mid-poll",
        || async {
            let asked = github.received_requests().await.unwrap().len();
            (asked >= 1).then_some(())
        },
    )
    .await;
    first.kill9();
    assert_eq!(
        task_count(&client).await,
        0,
        "the killed poll imported nothing"
    );

    // The poll job's lease expires; the other worker takes the schedule over.
    let _second = worker("worker-b");
    wait_for(
        Duration::from_secs(30),
        "the second worker's imports",
        || async { (task_count(&client).await == 2).then_some(()) },
    )
    .await;
    let asked = github.received_requests().await.unwrap().len();
    wait_for(Duration::from_secs(30), "two more polls", || async {
        let now = github.received_requests().await.unwrap().len();
        (now >= asked + 4).then_some(())
    })
    .await;
    assert_eq!(task_count(&client).await, 2);
    let items = items_of(&client, &id).await;
    assert_eq!(items.len(), 2, "{items:?}");
}

#[tokio::test]
async fn a_worker_killed_while_linear_holds_a_page_loses_nothing_and_duplicates_nothing() {
    let linear = MockServer::start().await;
    let first = json!([linear_issue(1, "Todo"), linear_issue(2, "Todo")]);
    linear_page(Value::Null, first, Some("cursor-2"))
        .mount(&linear)
        .await;
    // The second page is slow enough that the first worker is still waiting on it when it
    // is killed: nothing of the poll was imported yet.
    let held = Duration::from_secs(2);
    held_linear_page(
        json!("cursor-2"),
        json!([linear_issue(3, "Todo")]),
        None,
        held,
    )
    .mount(&linear)
    .await;
    let source = linear_source(&linear).await;
    let (client, id) = (source.client.clone(), source.id.clone());
    let env = [("ACME_LINEAR_API_KEY", LINEAR_CANARY)];
    let worker = |name: &str| {
        let data = source.dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        support::spawn_worker_with_env(&source.db_url, source.dir.path(), name, 1_000, &data, &env)
    };
    let second_pages = || async {
        let asked = linear.received_requests().await.unwrap();
        asked
            .iter()
            .filter(|r| {
                let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
                body["variables"]["after"] == "cursor-2"
            })
            .count()
    };
    let mut first = worker("worker-a");
    let background = format!("/v1/external-work/sources/{id}/background");
    let (status, body) = client.post(&background, json!({ "enabled": true })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    wait_for(
        Duration::from_secs(20),
        "the first worker to wait on the second page",
        || async { (second_pages().await >= 1).then_some(()) },
    )
    .await;
    first.kill9();
    assert_eq!(
        task_count(&client).await,
        0,
        "the killed poll imported nothing"
    );

    // The poll job's lease expires; the other worker polls the source to its end.
    let _second = worker("worker-b");
    wait_for(
        Duration::from_secs(30),
        "the second worker's imports",
        || async { (task_count(&client).await == 3).then_some(()) },
    )
    .await;
    // Reading the project again (the background interval is the default 30 s, so by hand)
    // finds only duplicates.
    let summary = polled(&client, &id).await;
    assert_eq!(summary.duplicates, 3, "{summary:?}");
    assert_eq!(task_count(&client).await, 3);
    assert_eq!(items_of(&client, &id).await.len(), 3);
    assert!(!first.log_text().contains(LINEAR_CANARY));
}

#[tokio::test]
async fn a_remote_caller_cannot_aim_a_token_elsewhere_or_read_the_hosts_files() {
    const SECRET: &str = "external-shared-secret-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let db_url = support::fresh_database().await;
    let env = [
        ("KEEL_REMOTE_MODE", "1"),
        ("KEEL_RUNTIME_ID", "rt_external"),
        ("KEEL_REMOTE_SHARED_SECRET", SECRET),
    ];
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &env).await;
    let base = api.client.as_ref().unwrap().base.clone();
    let remote = support::client_with_headers(
        &base,
        &[
            ("x-keel-remote-secret", SECRET),
            ("x-keel-actor-id", "actor_x"),
            ("x-keel-org-id", "org_x"),
            ("x-keel-runtime-id", "rt_external"),
        ],
    );
    let (status, body) = register(&remote, &github_workflow("http://127.0.0.1:9", 30_000)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let file = dir.path().join("WORKFLOW.md");
    std::fs::write(&file, WORKFLOW).unwrap();
    let by_path = json!({ "workflow_path": file.to_str().unwrap() });
    let (status, body) = remote.post("/v1/external-work/sources", by_path).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = register(&remote, WORKFLOW).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}
