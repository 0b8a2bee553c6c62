//! The loop external work closes (issue 48), end to end with real processes: a GitHub issue
//! becomes a task; its agent run (a scripted local model that writes a file) works in a
//! clone served by the real `git http-backend`, and its result is pushed to the item's
//! branch; a `pull_request` action is proposed, approved and executed; the GitHub stand-in
//! then lists the pull request, whose head fails a check; CI triage records it and its fix
//! run pushes again, on a branch of its own; the issue closes and the next poll ends its item.
//! Every request Keel sends the stand-in is an operation of GitHub's published description.

use crate::agent_loop::Stack;
use crate::repo_push::{git_out, serve_smart};
use crate::repo_workspaces::repository;
use crate::support;
use crate::support::llm::Turn;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use keel_client::{
    ActionRecord, ActionStatus, FixRun, ItemRecord, ItemState, Proposed, RunStatus, ScanStatus,
    SourceRecord, TriageScan, TriageStatus,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

const WAIT: Duration = Duration::from_secs(60);
const REPO_TOKEN: &str = "loop-push-token-9c1";
const CANARY: &str = "ghp_loopcanary0123456789abcdef";
const T1: &str = "2026-11-30T09:00:00Z";

/// What the stand-in knows: the issue's state, and the pull request Keel opened (with its
/// head once the test has read it from the origin).
#[derive(Default)]
struct Tracker {
    issue_state: String,
    opened: Option<Value>,
    head: Option<String>,
}

fn issue(state: &str) -> Value {
    json!({ "id": 1007, "number": 7, "title": "The widget is broken", "state": state,
            "updated_at": if state == "open" { T1 } else { "2026-11-30T12:00:00Z" },
            "html_url": "https://github.com/acme/widgets/issues/7" })
}

fn pull(opened: &Value, head: &str) -> Value {
    json!({ "id": 2012, "number": 12, "title": opened["title"], "state": "open",
            "updated_at": "2026-11-30T10:00:00Z", "body": opened["body"],
            "head": { "sha": head, "ref": opened["head"] }, "base": { "ref": opened["base"] } })
}

/// GitHub as far as the loop goes: the issue, the pull request Keel opens, and a failing
/// `lint` check run on its head.
async fn github(state: Arc<Mutex<Tracker>>) -> MockServer {
    let github = MockServer::start().await;
    let read = |state: &Arc<Mutex<Tracker>>, f: fn(&Tracker) -> Value| {
        let state = state.clone();
        move |_: &Request| ResponseTemplate::new(200).set_body_json(f(&state.lock().unwrap()))
    };
    let get = |at: &str| Mock::given(method("GET")).and(path(at.to_string()));
    get("/repos/acme/widgets/issues")
        .respond_with(read(&state, |t| json!([issue(&t.issue_state)])))
        .mount(&github)
        .await;
    get("/repos/acme/widgets/issues/7")
        .respond_with(read(&state, |t| issue(&t.issue_state)))
        .mount(&github)
        .await;
    let listed = |t: &Tracker| match (&t.opened, &t.head) {
        (Some(opened), Some(head)) => json!([pull(opened, head)]),
        _ => json!([]),
    };
    get("/repos/acme/widgets/pulls")
        .respond_with(read(&state, listed))
        .mount(&github)
        .await;
    get("/repos/acme/widgets/pulls/12")
        .respond_with(read(&state, |t| {
            pull(t.opened.as_ref().unwrap(), t.head.as_ref().unwrap())
        }))
        .mount(&github)
        .await;
    let opening = state.clone();
    Mock::given(method("POST"))
        .and(path("/repos/acme/widgets/pulls"))
        .respond_with(move |request: &Request| {
            let sent: Value = serde_json::from_slice(&request.body).unwrap();
            opening.lock().unwrap().opened = Some(sent);
            ResponseTemplate::new(201).set_body_json(json!({ "id": 2012, "number": 12,
                "html_url": "https://github.com/acme/widgets/pull/12" }))
        })
        .mount(&github)
        .await;
    get("/repos/acme/widgets/actions/runs")
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "workflow_runs": [] })))
        .mount(&github)
        .await;
    Mock::given(method("GET"))
        .and(path_regex(
            r"^/repos/acme/widgets/commits/[0-9a-f]{40}/check-runs$",
        ))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({ "check_runs": [
            { "id": 880, "name": "lint", "conclusion": "failure",
              "html_url": "https://github.com/acme/widgets/runs/880",
              "output": { "title": "fix.txt", "summary": "fix.txt must say it was fixed again" } }
        ] })),
        )
        .mount(&github)
        .await;
    github
}

fn workflow(github: &str, repo: &str) -> String {
    format!(
        "---
tracker:
  kind: github
  endpoint: {github}
  repository: acme/widgets
  api_key: $ACME_GITHUB_TOKEN
  events: [issue.opened]
task:
  execution_kind: agent_loop
  repo: {repo}
  repo_credential: env:REPO_TEST_TOKEN
  base_branch: main
  push_branch: \"keel/issue-{{{{ issue.identifier | split: '#' | last }}}}\"
---
Fix {{{{ issue.title }}}}.
"
    )
}

#[tokio::test]
async fn a_tracker_issue_becomes_a_reviewed_change_and_its_failing_check_a_fix() {
    let Origin {
        _dir: _origin,
        bare,
        url: repo,
    } = origin().await;
    let state = Arc::new(Mutex::new(Tracker {
        issue_state: "open".into(),
        ..Tracker::default()
    }));
    let github = github(state.clone()).await;
    let script = vec![
        Turn::tool_call(
            "w1",
            "file_write",
            r#"{"path":"fix.txt","content":"fixed\n"}"#,
        ),
        Turn::text("Fixed the widget."),
        Turn::tool_call(
            "w2",
            "file_write",
            r#"{"path":"fix.txt","content":"fixed again\n"}"#,
        ),
        Turn::text("Fixed the lint."),
    ];
    let env = [
        ("REPO_TEST_TOKEN", REPO_TOKEN),
        ("ACME_GITHUB_TOKEN", CANARY),
    ];
    let stack = Stack::start_with("none", script, &env).await;
    let c = &stack.client;

    // The issue becomes a task; its agent run's result is pushed to the item's branch.
    let body = json!({ "workflow_markdown": workflow(&github.uri(), &repo) });
    let (source, poll) = registered_and_polled(c, body).await;
    let item = newest(c, &source, "acme/widgets#7").await;
    let (task_id, run_id) = (item.task_id.clone().unwrap(), item.run_id.clone().unwrap());
    let run = c.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(git_out(&bare, &["show", "keel/issue-7:fix.txt"]), "fixed\n");
    let head = git_out(&bare, &["rev-parse", "keel/issue-7"])
        .trim()
        .to_string();

    // A pull request from that branch: proposed, approved, executed.
    let sent = sent_action(c, &item, json!({ "kind": "pull_request" })).await;
    let opened = state.lock().unwrap().opened.clone().unwrap();
    assert_eq!(
        (opened["head"].as_str(), opened["base"].as_str()),
        (Some("keel/issue-7"), Some("main"))
    );
    assert!(
        opened["body"].as_str().unwrap().starts_with("Closes #7."),
        "{opened}"
    );
    assert_eq!(
        sent.response.unwrap()["url"],
        "https://github.com/acme/widgets/pull/12"
    );

    // GitHub lists the pull request, at the pushed head; its `lint` fails. The workflow's
    // events start work on issues only: the pull request is recorded, not worked on.
    state.lock().unwrap().head = Some(head.clone());
    let (status, body) = c.post(&poll, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let pull_item = newest(c, &source, "acme/widgets#12").await;
    assert_eq!(pull_item.kind, "github_pull_request");
    assert_eq!(pull_item.task_id, None, "{pull_item:?}");

    // Triage: the failing check, with its fix task on the pull request's branch.
    let at = format!("/v1/external-work/items/{}/ci-triage", pull_item.id);
    let (status, body) = c.post(&at, json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let scan: TriageScan = support::record(&body);
    let scan = support::wait_for(WAIT, "the scan to end", || async {
        let scan = c.api.get_triage_scan(&scan.id).await.unwrap().data;
        (scan.status != ScanStatus::Queued).then_some(scan)
    })
    .await;
    assert_eq!(scan.status, ScanStatus::Done, "{scan:?}");
    let triage_id = scan.summary.unwrap()["triage_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let record = c.api.get_triage(&triage_id).await.unwrap().data;
    assert_eq!(
        (record.status, record.check_name.as_str()),
        (TriageStatus::TaskCreated, "lint")
    );
    let (status, body) = c
        .post_empty(&format!("/v1/external-work/ci-triage/{triage_id}/run"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let fix: FixRun = support::record(&body);
    let fixed = c
        .wait_terminal(record.task_id.as_deref().unwrap(), &fix.run.id, WAIT)
        .await;
    assert_eq!(fixed.status, RunStatus::Completed, "{fixed:?}");
    let branch = format!("keel/ci-fix/12-{}", &head[..7]);
    assert_eq!(
        git_out(&bare, &["show", &format!("{branch}:fix.txt")]),
        "fixed again\n"
    );
    assert_eq!(
        git_out(&bare, &["rev-parse", &format!("{branch}~1")]).trim(),
        head,
        "on the pull request's head"
    );
    let prompt = &stack.llm.requests()[2].body;
    assert!(
        prompt
            .to_string()
            .contains("fix.txt must say it was fixed again"),
        "{prompt}"
    );

    // The issue closes: the next poll ends its item (its run is done: reconciling asks the
    // tracker only about items with a run going, a retry coming or a workspace).
    state.lock().unwrap().issue_state = "closed".into();
    let (status, body) = c.post(&poll, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["terminal"], 1, "{body}");
    let closed = support::wait_for(WAIT, "the issue's item to end", || async {
        let items = c.api.list_items(&source).await.unwrap().data;
        items
            .into_iter()
            .find(|i| i.identifier == "acme/widgets#7" && i.state == ItemState::Terminal)
    })
    .await;
    assert_eq!(closed.tracker_state, "closed");

    // Every request Keel sent GitHub is one of its published operations, the writes only
    // the pull request; the token is in no row.
    let received = github.received_requests().await.unwrap();
    let writes: Vec<String> = received
        .iter()
        .filter(|r| r.method.as_str() != "GET")
        .map(|r| format!("{} {}", r.method, r.url.path()))
        .collect();
    assert_eq!(writes, ["POST /repos/acme/widgets/pulls"]);
    support::contracts::assert_github_conforms(&received);
    assert_eq!(
        support::rows_containing(&stack.db_url(), CANARY).await,
        Vec::<String>::new()
    );
}

/// The origin repository, served by the real `git http-backend` to the push token.
struct Origin {
    _dir: tempfile::TempDir,
    /// The bare repository, to read what was pushed.
    bare: std::path::PathBuf,
    url: String,
}

async fn origin() -> Origin {
    let dir = repository();
    let authorization = format!(
        "Basic {}",
        STANDARD.encode(format!("x-access-token:{REPO_TOKEN}"))
    );
    let url = format!("{}/repo.git", serve_smart(dir.path(), authorization).await);
    Origin {
        bare: dir.path().join("repo.git"),
        _dir: dir,
        url,
    }
}

/// Registers the source `body` describes and polls it once; its id and its poll's path.
async fn registered_and_polled(c: &support::Client, body: Value) -> (String, String) {
    let (status, body) = c.post("/v1/external-work/sources", body).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let source = support::record::<SourceRecord>(&body).id;
    let poll = format!("/v1/external-work/sources/{source}/poll");
    let (status, body) = c.post(&poll, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    (source, poll)
}

/// The action `proposal` on `item`: proposed, approved, executed, and once it is sent.
async fn sent_action(c: &support::Client, item: &ItemRecord, proposal: Value) -> ActionRecord {
    let at = format!("/v1/external-work/items/{}/actions", item.id);
    let (status, body) = c.post(&at, proposal).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let Proposed { action, approval } = support::record(&body);
    let resolve = format!(
        "/v1/tasks/{}/approvals/{}/resolve",
        approval.task_id, approval.id
    );
    let (status, body) = c.post(&resolve, json!({ "decision": "approve" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = c
        .post_empty(&format!("/v1/external-work/actions/{}/execute", action.id))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    support::wait_for(WAIT, "the action to be sent", || async {
        let current: ActionRecord = c.api.get_action(&action.id).await.unwrap().data;
        (current.status == ActionStatus::Sent).then_some(current)
    })
    .await
}

/// The newest version of the item `identifier`.
async fn newest(c: &support::Client, source: &str, identifier: &str) -> ItemRecord {
    let items = c.api.list_items(source).await.unwrap().data;
    items
        .into_iter()
        .filter(|i| i.identifier == identifier)
        .max_by_key(|i| i.created_at)
        .unwrap_or_else(|| panic!("no item {identifier}"))
}

/// What the Linear stand-in knows: ENG-7's state and the comments made on it.
#[derive(Default)]
struct Board {
    state: String,
    comments: Vec<Value>,
}

fn linear_issue(state: &str) -> Value {
    json!({ "id": "uuid-7", "identifier": "ENG-7", "title": "The widget is broken",
            "priority": 2, "state": { "name": state }, "branchName": "eng-7-the-widget",
            "updatedAt": if state == "Todo" { "2026-11-30T09:00:00.000Z" }
                         else { "2026-11-30T12:00:00.000Z" },
            "labels": { "nodes": [] }, "inverseRelations": { "nodes": [] } })
}

/// Linear's GraphQL endpoint as far as Keel's documents go, each answered by its name:
/// the project's active issues, issues by id, the comment mutation and the marked
/// comments lookup.
async fn linear(board: Arc<Mutex<Board>>) -> MockServer {
    let linear = MockServer::start().await;
    let answer = move |request: &Request| {
        let sent: Value = serde_json::from_slice(&request.body).unwrap();
        let document = sent["query"].as_str().unwrap();
        let mut board = board.lock().unwrap();
        let issues = |nodes: Vec<Value>| {
            json!({ "data": { "issues": { "nodes": nodes,
                "pageInfo": { "hasNextPage": false, "endCursor": null } } } })
        };
        let data = if document.contains("KeelCandidates") {
            let active = board.state == "Todo";
            issues(
                active
                    .then(|| linear_issue(&board.state))
                    .into_iter()
                    .collect(),
            )
        } else if document.contains("KeelIssues") {
            issues(vec![linear_issue(&board.state)])
        } else if document.contains("KeelComment") {
            let comment = json!({ "id": "comment-1", "url": "https://linear.app/c/1",
                                  "body": sent["variables"]["body"] });
            board.comments.push(comment.clone());
            json!({ "data": { "commentCreate": { "success": true, "comment": comment } } })
        } else {
            let nodes = board.comments.clone();
            json!({ "data": { "issue": { "comments": { "nodes": nodes } } } })
        };
        ResponseTemplate::new(200).set_body_json(data)
    };
    Mock::given(method("POST"))
        .and(path("/graphql"))
        .respond_with(answer)
        .mount(&linear)
        .await;
    linear
}

fn linear_workflow(linear: &str, repo: &str, root: &str) -> String {
    format!(
        "---
tracker:
  kind: linear
  endpoint: {linear}/graphql
  project_slug: eng
  api_key: $ACME_LINEAR_API_KEY
  active_states: [Todo]
  terminal_states: [Done]
workspace:
  root: {root}
task:
  execution_kind: agent_loop
  repo: {repo}
  repo_credential: env:REPO_TEST_TOKEN
  base_branch: main
  push_branch: \"keel/{{{{ issue.identifier }}}}\"
---
Fix {{{{ issue.title }}}}.
"
    )
}

/// The same loop on Linear, as far as its API goes (it has no pull requests or checks):
/// the issue becomes a task whose agent run works in the item's workspace on a clone and
/// pushes its branch; a comment naming it is proposed, approved and executed through
/// `commentCreate`; the issue moves to Done, the next poll ends its item and the workers'
/// maintenance removes its workspace. Every document Keel sent is one Linear's schema takes.
#[tokio::test]
async fn a_linear_issue_becomes_a_pushed_change_and_its_end_cleans_the_workspace() {
    let Origin {
        _dir: _origin,
        bare,
        url: repo,
    } = origin().await;
    let board = Arc::new(Mutex::new(Board {
        state: "Todo".into(),
        ..Board::default()
    }));
    let linear = linear(board.clone()).await;
    let roots = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(roots.path()).unwrap();
    let root = root.to_str().unwrap();
    let script = vec![
        Turn::tool_call(
            "w1",
            "file_write",
            r#"{"path":"fix.txt","content":"fixed\n"}"#,
        ),
        Turn::text("Fixed the widget."),
    ];
    let env = [
        ("REPO_TEST_TOKEN", REPO_TOKEN),
        ("ACME_LINEAR_API_KEY", CANARY),
        ("KEEL_WORKSPACE_ROOTS", root),
    ];
    let stack = Stack::start_with("none", script, &env).await;
    let c = &stack.client;

    let body = json!({ "workflow_markdown": linear_workflow(&linear.uri(), &repo, root) });
    let (source, poll) = registered_and_polled(c, body).await;
    let item = support::wait_for(WAIT, "ENG-7's task", || async {
        let item = newest(c, &source, "ENG-7").await;
        item.run_id.is_some().then_some(item)
    })
    .await;
    let (task_id, run_id) = (item.task_id.clone().unwrap(), item.run_id.clone().unwrap());
    let run = c.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(git_out(&bare, &["show", "keel/ENG-7:fix.txt"]), "fixed\n");
    let workspace = newest(c, &source, "ENG-7").await.workspace_path.unwrap();
    assert!(
        std::path::Path::new(&workspace).starts_with(root),
        "{workspace}"
    );

    // A comment naming the branch: proposed, approved, executed.
    let proposal = json!({ "kind": "comment", "body": "Pushed to keel/ENG-7." });
    sent_action(c, &item, proposal).await;
    let comments = board.lock().unwrap().comments.clone();
    assert_eq!(comments.len(), 1, "{comments:?}");
    assert!(
        comments[0]["body"]
            .as_str()
            .unwrap()
            .starts_with("Pushed to keel/ENG-7."),
        "{comments:?}"
    );

    // Done: the next poll asks after the item (it has a workspace) and ends it; the
    // workers' maintenance removes its directory.
    board.lock().unwrap().state = "Done".into();
    let (status, body) = c.post(&poll, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["terminal"], 1, "{body}");
    let gone = || async { (!std::path::Path::new(&workspace).exists()).then_some(()) };
    support::wait_for(WAIT, "the workspace to go", gone).await;

    support::contracts::assert_linear_conforms(&linear.received_requests().await.unwrap());
    assert_eq!(
        support::rows_containing(&stack.db_url(), CANARY).await,
        Vec::<String>::new()
    );
}
