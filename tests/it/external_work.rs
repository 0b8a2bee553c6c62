//! External work against real `keel` processes: WORKFLOW.md errors over HTTP and on the
//! command line, sources, GitHub polls against a local server speaking GitHub's REST
//! protocol (ETags, 304, rate limits), Linear polls against one speaking Linear's GraphQL
//! (pages, `RATELIMITED`), and imports that create each task once.

use crate::support;

use std::time::Duration;

use crate::support::tracker;
use crate::support::{Client, TestApp, rows_containing, wait_for};
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
        body["data"]["prompt"],
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
    let (status, body) = client.get("/v1/tasks?limit=200").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["data"].as_array().unwrap().len()
}

#[tokio::test]
async fn a_source_registers_once_and_reports_its_health() {
    let app = TestApp::api_only().await;
    let markdown = github_workflow("http://127.0.0.1:9", 30_000);
    let (status, first) = register(&app.client, &markdown).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let id = first["data"]["id"].as_str().unwrap().to_string();
    let (status, again) = register(&app.client, &markdown).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["data"]["id"], id.as_str());
    let (status, listed) = app.client.get("/v1/external-work/sources?limit=1").await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["data"][0]["id"], id.as_str());
    assert_eq!(listed["has_more"], false);

    let (status, body) = app
        .client
        .get(&format!("/v1/external-work/sources/{id}/status"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let health = &body["data"];
    assert_eq!(health["workflow"]["valid"], true, "{body}");
    assert_eq!(health["workflow"]["repository"], "acme/widgets");
    assert_eq!(health["secret"]["ref"], "env:ACME_GITHUB_TOKEN");
    assert_eq!(health["secret"]["configured"], false, "{body}");
    assert_eq!(health["records"]["total"], 0);
    assert_eq!(health["background"]["running"], false);

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
    let file_id = body["data"]["id"].as_str().unwrap().to_string();
    std::fs::write(&file, "---\n- broken\n---\n").unwrap();
    let (status, body) = app
        .client
        .get(&format!("/v1/external-work/sources/{file_id}/status"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["workflow"]["valid"], false);
    assert_eq!(
        body["data"]["workflow"]["error"]["type"],
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

    let dir = tempfile::tempdir().unwrap();
    let db_url = support::fresh_database().await;
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &[TOKEN_ENV]).await;
    let client = api.client.clone().unwrap();
    let (status, body) = register(&client, &github_workflow(&github.uri(), 30_000)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["data"]["id"].as_str().unwrap().to_string();
    let poll_path = format!("/v1/external-work/sources/{id}/poll");
    let poll = || client.post(&poll_path, json!({}));

    let (status, body) = poll().await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let summary = &body["data"];
    assert_eq!(summary["candidates"], 3, "{body}");
    assert_eq!(summary["claimed"], 2, "{body}");
    assert_eq!(summary["terminal"], 1, "{body}");
    assert_eq!(task_count(&client).await, 2);
    let (_, items) = client
        .get(&format!("/v1/external-work/sources/{id}/items"))
        .await;
    let items = items["data"].as_array().unwrap().clone();
    let keys: Vec<&str> = items
        .iter()
        .map(|i| i["idempotency_key"].as_str().unwrap())
        .collect();
    assert!(
        keys.contains(&"github:pull_request:acme/widgets:3:0123abc:2026-11-30T09:30:00Z"),
        "{keys:?}"
    );
    let claimed = items
        .iter()
        .find(|i| i["identifier"] == "acme/widgets#1")
        .unwrap();
    assert_eq!(claimed["state"], "claimed");
    assert_eq!(claimed["prompt"], "Work on acme/widgets#1: issue 1");
    let (_, task) = client
        .get(&format!(
            "/v1/tasks/{}",
            claimed["task_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(task["data"]["prompt"], "Work on acme/widgets#1: issue 1");
    assert_eq!(task["data"]["status"], "queued", "{task}");
    let run = format!(
        "/v1/tasks/{}/runs/{}",
        claimed["task_id"].as_str().unwrap(),
        claimed["run_id"].as_str().unwrap()
    );
    let (_, evidence) = client.get(&format!("{run}/artifacts")).await;
    let names: Vec<&str> = evidence["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{evidence}");
    assert!(names.contains(&"external_work_item.json") && names.contains(&"prompt.md"));
    let item_artifact = evidence["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "external_work_item.json")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, item_json) = client
        .get(&format!("{run}/artifacts/{item_artifact}/content"))
        .await;
    assert_eq!(item_json["identifier"], "acme/widgets#1", "{item_json}");
    assert_eq!(item_json["labels"], json!(["bug"]));

    // 304: nothing changes, and the ETags stay for the poll after.
    for _ in 0..2 {
        let (status, body) = poll().await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["data"]["not_modified"], true, "{body}");
        assert_eq!(body["data"]["candidates"], 0);
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
    assert_eq!(body["data"]["duplicate"], true);
    let (status, body) = import(github_issue(4, "open")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["data"]["item"]["state"], "claimed");
    let (status, again) = import(github_issue(4, "open")).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["data"]["item"]["id"], body["data"]["item"]["id"]);
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
    let (status, body) = poll().await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["error_code"], "rate_limited", "{body}");
    assert!(body["data"]["backoff_until"].is_string(), "{body}");
    let asked = github.received_requests().await.unwrap().len();
    let (_, body) = poll().await;
    assert_eq!(body["data"]["candidates"], 0, "{body}");
    assert_eq!(github.received_requests().await.unwrap().len(), asked);
    let (_, status) = client
        .get(&format!("/v1/external-work/sources/{id}/status"))
        .await;
    let health = &status["data"];
    assert_eq!(health["workflow"]["valid"], true);
    assert_eq!(health["secret"]["configured"], true, "{status}");
    assert!(
        health["background"]["backoff_until"].is_string(),
        "{status}"
    );
    assert_eq!(
        health["last_errors"]["poll"]["code"], "rate_limited",
        "{status}"
    );
    assert_eq!(health["records"]["claimed"], 3, "{status}");
    assert!(!status.to_string().contains(CANARY));

    assert_eq!(rows_containing(&db_url, CANARY).await, Vec::<String>::new());
    drop(api);
    let log = std::fs::read_to_string(dir.path().join("api.log")).unwrap();
    assert!(!log.contains(CANARY), "the token is in the API log");
}

const LINEAR_CANARY: &str = "lin_api_canary_0badf00d";

fn linear_workflow(endpoint: &str) -> String {
    format!(
        "---
tracker:
  kind: linear
  endpoint: {endpoint}
  project_slug: eng
  api_key: $ACME_LINEAR_API_KEY
task:
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
    let dir = tempfile::tempdir().unwrap();
    let db_url = support::fresh_database().await;
    let env = [("ACME_LINEAR_API_KEY", LINEAR_CANARY)];
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &env).await;
    let client = api.client.clone().unwrap();
    let endpoint = format!("{}/graphql", linear.uri());
    let (status, body) = register(&client, &linear_workflow(&endpoint)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["data"]["id"].as_str().unwrap().to_string();
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
    let poll_path = format!("/v1/external-work/sources/{id}/poll");
    let poll = || client.post(&poll_path, json!({}));

    let (status, body) = poll().await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["candidates"], 3, "{body}");
    assert_eq!(body["data"]["error_code"], Value::Null, "{body}");
    assert_eq!(linear.received_requests().await.unwrap().len(), 2);
    let items = items_of(&client, &id).await;
    let third = items.iter().find(|i| i["identifier"] == "ENG-3").unwrap();
    assert_eq!(
        third["idempotency_key"],
        "linear:issue:eng:ENG-3:2026-11-30T10:00:00.000Z"
    );
    assert_eq!(third["prompt"], "Work on ENG-3 (In Progress), blocked by 1");
    assert_eq!(body["data"]["claimed"], 3, "{body}");
    let tasks = task_count(&client).await;
    assert_eq!(tasks, 3, "{items:?}");

    // The same versions again: duplicates, nothing new.
    let (_, body) = poll().await;
    assert_eq!(body["data"]["duplicates"], 3, "{body}");
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
    assert_eq!(body["data"]["duplicate"], false, "{body}");
    // ENG-1 already has its task: the new version is recorded, no second task.
    assert_eq!(task_count(&client).await, tasks);

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
    let (_, body) = poll().await;
    assert_eq!(body["data"]["error_code"], "rate_limited", "{body}");
    let until: chrono::DateTime<chrono::Utc> = body["data"]["backoff_until"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(until.timestamp(), reset.timestamp(), "{body}");
    let asked = linear.received_requests().await.unwrap().len();
    let (_, body) = poll().await;
    assert_eq!(body["data"]["candidates"], 0, "{body}");
    assert_eq!(linear.received_requests().await.unwrap().len(), asked);

    assert_eq!(
        rows_containing(&db_url, LINEAR_CANARY).await,
        Vec::<String>::new()
    );
    drop(api);
    let log = std::fs::read_to_string(dir.path().join("api.log")).unwrap();
    assert!(!log.contains(LINEAR_CANARY), "the key is in the API log");
}

#[tokio::test]
async fn an_item_that_leaves_the_active_states_has_its_run_cancelled() {
    let linear = MockServer::start().await;
    let first = json!([linear_issue(1, "Todo"), linear_issue(2, "Todo")]);
    linear_page(Value::Null, first, None).mount(&linear).await;
    // No worker: the imported runs stay queued, which is active.
    let source = linear_source(&linear).await;
    let (client, id) = (source.client.clone(), source.id.clone());
    let poll_path = format!("/v1/external-work/sources/{id}/poll");
    let (_, body) = client.post(&poll_path, json!({})).await;
    assert_eq!(body["data"]["claimed"], 2, "{body}");
    let items = items_of(&client, &id).await;
    let one = items.iter().find(|i| i["identifier"] == "ENG-1").unwrap();

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
    let (_, body) = client.post(&poll_path, json!({})).await;
    assert_eq!(body["data"]["error_code"], Value::Null, "{body}");
    assert_eq!(body["data"]["cancelled_runs"], 1, "{body}");
    assert_eq!(body["data"]["terminal"], 1, "{body}");
    assert_eq!(body["data"]["duplicates"], 1, "{body}");
    let run = run_of(&client, one).await;
    assert_eq!(run["status"], "cancelled", "{run}");
    let reason = run["last_error"].as_str().unwrap();
    assert!(reason.contains("ENG-1 left the active states"), "{reason}");
    // ENG-2's run goes on.
    let two = items.iter().find(|i| i["identifier"] == "ENG-2").unwrap();
    assert_eq!(run_of(&client, two).await["status"], "queued");
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
    let poll_path = format!("/v1/external-work/sources/{id}/poll");
    let (_, body) = client.post(&poll_path, json!({})).await;
    assert_eq!(body["data"]["claimed"], 1, "{body}");
    let items = items_of(&client, &id).await;
    let five = items.iter().find(|i| i["identifier"] == "ENG-5").unwrap();
    assert_eq!(five["state"], "discovered", "{five}");
    assert_eq!(five["last_error_code"], "blocked_by_open_issues", "{five}");
    assert!(
        five["last_error"].as_str().unwrap().contains("ENG-4"),
        "{five}"
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
    let (_, body) = client.post(&poll_path, json!({})).await;
    assert_eq!(body["data"]["claimed"], 1, "{body}");
    assert_eq!(body["data"]["cancelled_runs"], 1, "{body}");
    let items = items_of(&client, &id).await;
    let five = items.iter().find(|i| i["identifier"] == "ENG-5").unwrap();
    assert_eq!(five["state"], "claimed", "{five}");
    assert_eq!(task_count(&client).await, 2);
}

#[tokio::test]
async fn reconcile_asks_github_for_the_items_with_active_runs_only() {
    let github = MockServer::start().await;
    list("issues", json!([github_issue(1, "open")]), "\"i1\"")
        .mount(&github)
        .await;
    list("pulls", json!([]), "\"p1\"").mount(&github).await;
    let dir = tempfile::tempdir().unwrap();
    let db_url = support::fresh_database().await;
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &[TOKEN_ENV]).await;
    let client = api.client.clone().unwrap();
    let (_, body) = register(&client, &github_workflow(&github.uri(), 30_000)).await;
    let id = body["data"]["id"].as_str().unwrap().to_string();
    let (_, body) = client
        .post(&format!("/v1/external-work/sources/{id}/poll"), json!({}))
        .await;
    assert_eq!(body["data"]["claimed"], 1, "{body}");

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
    let (status, body) = client.post(&reconcile, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["cancelled_runs"], 1, "{body}");
    // One question, about the one item; the lists were not asked for.
    let asked = github.received_requests().await.unwrap();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let items = items_of(&client, &id).await;
    let claimed = items.iter().find(|i| i["state"] == "claimed").unwrap();
    assert_eq!(run_of(&client, claimed).await["status"], "cancelled");
    // Nothing is active any more: a second reconciliation asks nothing.
    let (_, body) = client.post(&reconcile, json!({})).await;
    assert_eq!(body["data"]["candidates"], 0, "{body}");
    assert_eq!(github.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn max_concurrent_agents_holds_items_back_until_a_slot_frees() {
    let github = MockServer::start().await;
    let issues = json!([github_issue(1, "open"), github_issue(2, "open")]);
    list("issues", issues, "\"i1\"").mount(&github).await;
    list("pulls", json!([]), "\"p1\"").mount(&github).await;
    let dir = tempfile::tempdir().unwrap();
    let db_url = support::fresh_database().await;
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &[TOKEN_ENV]).await;
    let client = api.client.clone().unwrap();
    let markdown = github_workflow(&github.uri(), 30_000).replacen(
        "polling:",
        "agent:\n  max_concurrent_agents: 1\npolling:",
        1,
    );
    let (status, body) = register(&client, &markdown).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["data"]["id"].as_str().unwrap().to_string();
    let poll_path = format!("/v1/external-work/sources/{id}/poll");
    let (_, body) = client.post(&poll_path, json!({})).await;
    assert_eq!(body["data"]["claimed"], 1, "{body}");
    assert_eq!(body["data"]["discovered"], 1, "{body}");
    assert_eq!(task_count(&client).await, 1);
    let items = items_of(&client, &id).await;
    let waiting = items.iter().find(|i| i["state"] == "discovered").unwrap();
    assert_eq!(waiting["last_error_code"], "no_free_slot", "{waiting}");
    let claimed = items.iter().find(|i| i["state"] == "claimed").unwrap();

    // Still full: the next poll starts nothing.
    let (_, body) = client.post(&poll_path, json!({})).await;
    assert_eq!(body["data"]["claimed"], 0, "{body}");
    // The first run ends: the next poll starts the waiting item, from what it stored.
    let (task_id, run_id) = (
        claimed["task_id"].as_str().unwrap(),
        claimed["run_id"].as_str().unwrap(),
    );
    let (status, body) = client
        .post(
            &format!("/v1/tasks/{task_id}/runs/{run_id}/cancel"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, body) = client.post(&poll_path, json!({})).await;
    assert_eq!(body["data"]["claimed"], 1, "{body}");
    assert_eq!(task_count(&client).await, 2);
    let items = items_of(&client, &id).await;
    let started = items.iter().find(|i| i["id"] == waiting["id"]).unwrap();
    assert_eq!(started["state"], "claimed", "{started}");
    assert_eq!(started["last_error_code"], Value::Null, "{started}");
}

#[tokio::test]
async fn a_failed_run_of_an_active_item_is_retried_with_its_attempt_rendered() {
    let github = MockServer::start().await;
    list("issues", json!([github_issue(1, "open")]), "\"i1\"")
        .mount(&github)
        .await;
    list("pulls", json!([]), "\"p1\"").mount(&github).await;
    let dir = tempfile::tempdir().unwrap();
    let db_url = support::fresh_database().await;
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &[TOKEN_ENV]).await;
    let client = api.client.clone().unwrap();
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
    let id = body["data"]["id"].as_str().unwrap().to_string();
    let poll_path = format!("/v1/external-work/sources/{id}/poll");
    let (_, body) = client.post(&poll_path, json!({})).await;
    assert_eq!(body["data"]["claimed"], 1, "{body}");
    let first = items_of(&client, &id).await[0].clone();
    let (task_id, run_id) = (
        first["task_id"].as_str().unwrap(),
        first["run_id"].as_str().unwrap(),
    );
    let failed = client
        .wait_terminal(task_id, run_id, Duration::from_secs(30))
        .await;
    assert_eq!(failed["status"], "failed", "{failed}");

    let (_, body) = client.post(&poll_path, json!({})).await;
    assert_eq!(body["data"]["retried"], 1, "{body}");
    let item = items_of(&client, &id).await[0].clone();
    assert_eq!(item["state"], "claimed", "{item}");
    assert_eq!(item["prompt"], "Try 1", "{item}");
    let retry_id = item["run_id"].as_str().unwrap();
    assert_ne!(retry_id, run_id);
    let retried = client
        .wait_terminal(task_id, retry_id, Duration::from_secs(30))
        .await;
    assert_eq!(retried["status"], "completed", "{retried}");
    assert_eq!(retried["retried_from_run_id"], run_id, "{retried}");
    // Completed: nothing more to retry.
    let (_, body) = client.post(&poll_path, json!({})).await;
    assert_eq!(body["data"]["retried"], 0, "{body}");
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
    let dir = tempfile::tempdir().unwrap();
    let db_url = support::fresh_database().await;
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &[TOKEN_ENV]).await;
    let client = api.client.clone().unwrap();
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
    let id = body["data"]["id"].as_str().unwrap().to_string();
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
    let (_, status) = client
        .get(&format!("/v1/external-work/sources/{id}/status"))
        .await;
    assert_eq!(status["data"]["records"]["total"], 3, "{status}");
    assert_eq!(status["data"]["background"]["running"], true);
    let last_poll = &status["data"];
    assert!(
        last_poll["last_errors"].as_object().unwrap().is_empty(),
        "{status}"
    );

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
    let dir = tempfile::tempdir().unwrap();
    let db_url = support::fresh_database().await;
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &[TOKEN_ENV]).await;
    let client = api.client.clone().unwrap();
    let worker = |name: &str| {
        let data = dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        support::spawn_worker_with_env(&db_url, dir.path(), name, 1_000, &data, &[TOKEN_ENV])
    };
    let mut first = worker("worker-a");
    let (_, body) = register(&client, &github_workflow(&github.uri(), 100)).await;
    let id = body["data"]["id"].as_str().unwrap().to_string();
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
    let (_, items) = client
        .get(&format!("/v1/external-work/sources/{id}/items"))
        .await;
    assert_eq!(items["data"].as_array().unwrap().len(), 2, "{items}");
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
    let (_, body) = client
        .post(&format!("/v1/external-work/sources/{id}/poll"), json!({}))
        .await;
    assert_eq!(body["data"]["duplicates"], 3, "{body}");
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
