//! External work items' workspaces and hooks against real `keel api` and `keel worker`
//! processes and a local GitHub: one directory per item under `workspace.root`,
//! `after_create` once per directory, `before_run`/`after_run` around each attempt with
//! their output as run artifacts, hook timeouts, the removal of a terminal item's
//! workspace after `before_remove`, and a root `KEEL_WORKSPACE_ROOTS` does not allow.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{Client, KeelProcess, wait_for};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};
#[path = "support/tracker.rs"]
mod tracker;
use tracker::{CANARY, TOKEN_ENV, github_issue, items_of, list, register};

/// A GitHub source on `github` whose items work under `root`, with `hooks` (YAML lines
/// under `hooks:`) and the task's shell command.
fn workflow(github: &MockServer, root: &Path, hooks: &str, command: &str) -> String {
    format!(
        "---
tracker:
  kind: github
  endpoint: {}
  repository: acme/widgets
  api_key: $ACME_GITHUB_TOKEN
workspace:
  root: {}
hooks:
{hooks}
task:
  execution_kind: shell
  shell_command: {command}
---
Work on {{{{ issue.identifier }}}}
",
        github.uri(),
        root.display()
    )
}

/// An API and a worker allowed to work beneath `allowed`, and a GitHub answering the
/// lists with `issues`.
struct Setup {
    github: MockServer,
    api: KeelProcess,
    _worker: KeelProcess,
    /// `workspace.root`, canonical, beneath the allowed root.
    root: PathBuf,
    /// Where the items' directories are: the local workspace's beneath the root.
    items: PathBuf,
    db_url: String,
    allowed: PathBuf,
    dir: tempfile::TempDir,
}

impl Setup {
    async fn new(issues: Value) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        let root = allowed.join("items");
        std::fs::create_dir_all(&root).unwrap();
        let root = std::fs::canonicalize(root).unwrap();
        let github = MockServer::start().await;
        serve(&github, issues).await;
        let db_url = support::fresh_database().await;
        let roots = ("KEEL_WORKSPACE_ROOTS", allowed.to_str().unwrap());
        let env = [TOKEN_ENV, roots];
        let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &env).await;
        let data = dir.path().join("worker");
        std::fs::create_dir_all(&data).unwrap();
        let worker =
            support::spawn_worker_with_env(&db_url, dir.path(), "worker", 2_000, &data, &env);
        Setup {
            github,
            api,
            _worker: worker,
            items: root.join("default"),
            root,
            db_url,
            allowed,
            dir,
        }
    }

    /// Kills the API process (SIGKILL) and starts another.
    async fn restart_api(&mut self) {
        self.api.kill9();
        let roots = ("KEEL_WORKSPACE_ROOTS", self.allowed.to_str().unwrap());
        let (db_url, dir) = (&self.db_url, self.dir.path());
        let env = [TOKEN_ENV, roots];
        self.api = support::spawn_api_with_env(db_url, dir, "api-2", &env).await;
    }

    fn client(&self) -> &Client {
        self.api.client.as_ref().unwrap()
    }

    async fn source(&self, markdown: &str) -> String {
        let (status, body) = register(self.client(), markdown).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["data"]["id"].as_str().unwrap().to_string()
    }

    async fn poll(&self, source_id: &str) -> Value {
        let path = format!("/v1/external-work/sources/{source_id}/poll");
        let (status, body) = self.client().post(&path, json!({})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["data"].clone()
    }

    /// The one item of the source, the newest version first.
    async fn newest_item(&self, source_id: &str) -> Value {
        items_of(self.client(), source_id).await.pop().unwrap()
    }

    async fn finished_run(&self, item: &Value) -> Value {
        let (task_id, run_id) = (item["task_id"].as_str(), item["run_id"].as_str());
        let (task_id, run_id) = (task_id.unwrap(), run_id.unwrap());
        let timeout = Duration::from_secs(30);
        self.client().wait_terminal(task_id, run_id, timeout).await
    }
}

/// The lists answer `issues` (no pull requests) from now on.
async fn serve(github: &MockServer, issues: Value) {
    github.reset().await;
    list("issues", issues, "\"i\"").mount(github).await;
    list("pulls", json!([]), "\"p\"").mount(github).await;
}

/// The text of each of a run's artifacts, by name.
async fn artifacts(client: &Client, run: &Value) -> Vec<(String, String, String)> {
    let (task_id, run_id) = (
        run["task_id"].as_str().unwrap(),
        run["id"].as_str().unwrap(),
    );
    let base = format!("/v1/tasks/{task_id}/runs/{run_id}/artifacts");
    let (status, body) = client.get(&base).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut found = Vec::new();
    for artifact in body["data"].as_array().unwrap() {
        let id = artifact["id"].as_str().unwrap();
        let url = format!("{}{base}/{id}/content", client.base);
        let text = client.http.get(url).send().await.unwrap().text().await;
        let name = artifact["name"].as_str().unwrap().to_string();
        let kind = artifact["kind"].as_str().unwrap().to_string();
        found.push((name, kind, text.unwrap()));
    }
    found
}

fn text_of<'a>(artifacts: &'a [(String, String, String)], name: &str) -> &'a str {
    let found = artifacts.iter().find(|(n, _, _)| n == name);
    &found
        .unwrap_or_else(|| panic!("no {name} in {artifacts:?}"))
        .2
}

#[tokio::test]
async fn an_items_run_works_in_its_workspace_between_its_hooks() {
    let setup = Setup::new(json!([github_issue(1, "open")])).await;
    let hooks = "  after_create: echo created >> after_create.txt; echo made it
  before_run: echo \"before in $PWD\"; echo careful >&2
  after_run: echo after; env >&2; exit 1";
    let markdown = workflow(&setup.github, &setup.root, hooks, "pwd");
    let id = setup.source(&markdown).await;
    let summary = setup.poll(&id).await;
    assert_eq!(summary["claimed"], 1, "{summary}");

    let workspace = setup.items.join("acme_widgets_1");
    let item = setup.newest_item(&id).await;
    assert_eq!(item["state"], "claimed", "{item}");
    assert_eq!(
        item["workspace_path"],
        workspace.to_str().unwrap(),
        "{item}"
    );
    let after_create = &item["hook_output"]["after_create"];
    assert_eq!(after_create["stdout"], "made it\n", "{item}");
    assert_eq!(after_create["error"], Value::Null, "{item}");
    let created = workspace.join("after_create.txt");
    assert_eq!(std::fs::read_to_string(&created).unwrap(), "created\n");

    // The run works in the item's workspace; after_run failed, the run did not.
    let run = setup.finished_run(&item).await;
    assert_eq!(run["status"], "completed", "{run}");
    let artifacts = artifacts(setup.client(), &run).await;
    let path = workspace.to_str().unwrap();
    assert_eq!(text_of(&artifacts, "stdout"), format!("{path}\n"));
    assert_eq!(
        text_of(&artifacts, "before_run.stdout"),
        format!("before in {path}\n")
    );
    assert_eq!(text_of(&artifacts, "before_run.stderr"), "careful\n");
    assert_eq!(text_of(&artifacts, "after_run.stdout"), "after\n");
    // Hooks never see the tracker's token.
    let env = text_of(&artifacts, "after_run.stderr");
    assert!(
        env.contains("KEEL_RUN_ID=") && !env.contains(CANARY),
        "{env}"
    );
    // In the order they ran, each stream of kind stdout or stderr.
    let written: Vec<(&str, &str)> = artifacts
        .iter()
        .filter(|(_, kind, _)| kind != "metadata")
        .map(|(name, kind, _)| (name.as_str(), kind.as_str()))
        .collect();
    let expected = [
        ("before_run.stdout", "stdout"),
        ("before_run.stderr", "stderr"),
        ("stdout", "stdout"),
        ("stderr", "stderr"),
        ("after_run.stdout", "stdout"),
        ("after_run.stderr", "stderr"),
    ];
    assert_eq!(written, expected, "{artifacts:?}");

    // A new version of the same item reuses the directory: after_create does not run again.
    let mut changed = github_issue(1, "open");
    changed["updated_at"] = json!("2026-11-30T10:00:00Z");
    serve(&setup.github, json!([changed])).await;
    let summary = setup.poll(&id).await;
    assert_eq!(summary["duplicates"], 0, "{summary}");
    assert_eq!(std::fs::read_to_string(&created).unwrap(), "created\n");
    let newest = setup.newest_item(&id).await;
    assert_eq!(newest["hook_output"], Value::Null, "{newest}");
}

#[tokio::test]
async fn a_failing_before_run_fails_the_attempt_and_the_item_waits_to_retry() {
    let setup = Setup::new(json!([github_issue(1, "open")])).await;
    let hooks = "  before_run: echo no checkout >&2; exit 1";
    let markdown = workflow(&setup.github, &setup.root, hooks, "touch ran.txt");
    let id = setup.source(&markdown).await;
    setup.poll(&id).await;
    let item = setup.newest_item(&id).await;
    let run = setup.finished_run(&item).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(
        run["last_error"], "hook_failed: before_run exited with code 1: no checkout",
        "{run}"
    );
    // The command never ran.
    assert!(!setup.items.join("acme_widgets_1/ran.txt").exists());
    let artifacts = artifacts(setup.client(), &run).await;
    assert_eq!(text_of(&artifacts, "before_run.stderr"), "no checkout\n");

    // The next poll puts the item through the retry path (10 s backoff first).
    setup.poll(&id).await;
    let item = setup.newest_item(&id).await;
    assert_eq!(item["state"], "retry_wait", "{item}");
    assert_eq!(item["last_error_code"], "run_failed", "{item}");
}

#[tokio::test]
async fn a_hook_past_its_timeout_is_killed() {
    let setup = Setup::new(json!([github_issue(1, "open")])).await;
    let hooks = "  before_run: sleep 30; echo woke
  timeout_ms: 500";
    let markdown = workflow(&setup.github, &setup.root, hooks, "exit 0");
    let id = setup.source(&markdown).await;
    let started = Instant::now();
    setup.poll(&id).await;
    let item = setup.newest_item(&id).await;
    let run = setup.finished_run(&item).await;
    assert_eq!(run["status"], "failed", "{run}");
    let error = run["last_error"].as_str().unwrap();
    assert!(
        error.starts_with("hook_failed: before_run timed out after 500 ms"),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "the hook ran its 30 s"
    );
    let artifacts = artifacts(setup.client(), &run).await;
    assert_eq!(text_of(&artifacts, "before_run.stdout"), "");
}

#[tokio::test]
async fn a_terminal_items_workspace_is_removed_after_before_remove() {
    let open = json!([
        github_issue(1, "open"),
        github_issue(2, "open"),
        github_issue(3, "open")
    ]);
    let setup = Setup::new(open.clone()).await;
    let hooks = "  before_remove: echo \"bye from $KEEL_ITEM_IDENTIFIER\"; ls; env >&2";
    let markdown = workflow(&setup.github, &setup.root, hooks, "touch work.txt");
    let id = setup.source(&markdown).await;
    let summary = setup.poll(&id).await;
    assert_eq!(summary["claimed"], 3, "{summary}");
    for item in items_of(setup.client(), &id).await {
        assert_eq!(setup.finished_run(&item).await["status"], "completed");
    }
    let workspace = setup.items.join("acme_widgets_1");
    assert!(workspace.join("work.txt").exists());
    // A link inside the workspace to a file outside it: the removal must not follow it.
    let outside = setup.root.parent().unwrap().join("keep.txt");
    std::fs::write(&outside, "kept").unwrap();
    std::os::unix::fs::symlink(&outside, workspace.join("link")).unwrap();
    // Issue 3's workspace swapped for a link to a directory outside the root.
    let elsewhere = setup.root.parent().unwrap().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("precious.txt"), "kept").unwrap();
    let swapped = setup.items.join("acme_widgets_3");
    std::fs::remove_dir_all(&swapped).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &swapped).unwrap();

    // A poll's list shows issues 1 and 3 closed.
    let closed = |number| {
        let mut closed = github_issue(number, "closed");
        closed["updated_at"] = json!("2026-11-30T11:00:00Z");
        closed
    };
    serve(
        &setup.github,
        json!([closed(1), github_issue(2, "open"), closed(3)]),
    )
    .await;
    let summary = setup.poll(&id).await;
    assert_eq!(summary["terminal"], 2, "{summary}");
    assert_eq!(summary["removed_workspaces"], 1, "{summary}");
    assert!(!workspace.exists());
    assert!(elsewhere.join("precious.txt").exists());
    let refused = newest_of(setup.client(), &id, "acme/widgets#3").await;
    assert_eq!(refused["last_error_code"], "workspace_refused", "{refused}");
    assert_eq!(refused["hook_output"], Value::Null, "{refused}");
    assert!(setup.items.join("acme_widgets_2").exists());
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "kept");
    let terminal = newest_of(setup.client(), &id, "acme/widgets#1").await;
    assert_eq!(terminal["state"], "terminal", "{terminal}");
    assert_eq!(terminal["workspace_path"], Value::Null, "{terminal}");
    let before_remove = &terminal["hook_output"]["before_remove"];
    assert_eq!(
        before_remove["stdout"], "bye from acme/widgets#1\nlink\nwork.txt\n",
        "{terminal}"
    );
    let env = before_remove["stderr"].as_str().unwrap();
    assert!(
        env.contains("KEEL_WORKSPACE=") && !env.contains(CANARY),
        "{env}"
    );

    // A reconcile asks about issue 2 (its run completed, its workspace stays) and finds it
    // closed.
    let mut closed = github_issue(2, "closed");
    closed["updated_at"] = json!("2026-11-30T12:00:00Z");
    Mock::given(method("GET"))
        .and(path("/repos/acme/widgets/issues/2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(closed))
        .mount(&setup.github)
        .await;
    let reconcile = format!("/v1/external-work/sources/{id}/reconcile");
    let (status, body) = setup.client().post(&reconcile, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["removed_workspaces"], 1, "{body}");
    assert!(!setup.items.join("acme_widgets_2").exists());
    // Nothing left to remove or to ask about.
    let requests = setup.github.received_requests().await.unwrap().len();
    let (_, body) = setup.client().post(&reconcile, json!({})).await;
    assert_eq!(body["data"]["removed_workspaces"], 0, "{body}");
    assert_eq!(
        setup.github.received_requests().await.unwrap().len(),
        requests
    );
}

/// The newest version of the item `identifier`.
async fn newest_of(client: &Client, source_id: &str, identifier: &str) -> Value {
    let items = items_of(client, source_id).await;
    let mut versions = items.into_iter().filter(|i| i["identifier"] == identifier);
    versions.next_back().unwrap()
}

#[tokio::test]
async fn a_root_outside_the_workspace_roots_is_refused_and_nothing_starts() {
    let setup = Setup::new(json!([github_issue(1, "open")])).await;
    let elsewhere = tempfile::tempdir().unwrap();
    let hooks = "  after_create: touch created.txt";
    let markdown = workflow(&setup.github, elsewhere.path(), hooks, "exit 0");
    let id = setup.source(&markdown).await;
    let summary = setup.poll(&id).await;
    assert_eq!(summary["claimed"], 0, "{summary}");
    assert_eq!(summary["error_code"], "workspace_refused", "{summary}");
    let error = summary["error"].as_str().unwrap();
    assert!(error.contains("is not beneath"), "{error}");
    let item = setup.newest_item(&id).await;
    assert_eq!(item["state"], "blocked", "{item}");
    assert_eq!(item["last_error_code"], "workspace_refused", "{item}");
    assert_eq!(item["task_id"], Value::Null, "{item}");
    let (_, source) = setup
        .client()
        .get(&format!("/v1/external-work/sources/{id}"))
        .await;
    assert_eq!(
        source["data"]["last_error_code"], "workspace_refused",
        "{source}"
    );
    let (_, tasks) = setup.client().get("/v1/tasks").await;
    assert_eq!(tasks["data"].as_array().unwrap().len(), 0, "{tasks}");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn a_process_killed_while_after_create_runs_leaves_the_item_to_the_next_poll() {
    let mut setup = Setup::new(json!([github_issue(1, "open")])).await;
    // The first after_create hangs, after leaving a sign that it started in the workspace
    // (the only directory its sandbox can write); the next one ends.
    let hooks =
        "  after_create: if [ -e started ]; then echo again; else touch started; sleep 30; fi";
    let markdown = workflow(&setup.github, &setup.root, hooks, "pwd");
    let id = setup.source(&markdown).await;
    // The poll's request ends with its process: its answer is never read.
    let client = setup.client().clone();
    let url = format!("{}/v1/external-work/sources/{id}/poll", client.base);
    let poll = tokio::spawn(async move { client.http.post(url).json(&json!({})).send().await });
    wait_for(Duration::from_secs(20), "after_create to start", || async {
        found_below(&setup.root, "started").then_some(())
    })
    .await;
    let item = setup.newest_item(&id).await;
    assert_eq!(item["state"], "workspace_preparing", "{item}");
    let status = format!("/v1/external-work/sources/{id}/status");
    let (_, body) = setup.client().get(&status).await;
    assert_eq!(body["data"]["records"]["workspace_preparing"], 1, "{body}");
    setup.restart_api().await;
    poll.abort();

    // The next poll prepares the item again: the directory was never marked prepared, so
    // after_create runs again, then the run starts there.
    let summary = setup.poll(&id).await;
    let item = setup.newest_item(&id).await;
    assert_eq!(summary["claimed"], 1, "{summary} {item}");
    assert_eq!(item["state"], "claimed", "{item}");
    assert_eq!(
        item["hook_output"]["after_create"]["stdout"], "again\n",
        "{item}"
    );
    let run = setup.finished_run(&item).await;
    assert_eq!(run["status"], "completed", "{run}");
    let workspace = setup.items.join("acme_widgets_1");
    let artifacts = artifacts(setup.client(), &run).await;
    let stdout = text_of(&artifacts, "stdout");
    assert_eq!(stdout, format!("{}\n", workspace.display()));
}

/// Whether a file named `name` exists anywhere below `root`.
fn found_below(root: &std::path::Path, name: &str) -> bool {
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .any(|entry| {
            let path = entry.path();
            entry.file_name() == name || (path.is_dir() && found_below(&path, name))
        })
}
