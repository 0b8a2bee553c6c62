//! External work items' workspaces and hooks against real `keel api` and `keel worker`
//! processes and a local GitHub: one directory per item under `workspace.root`,
//! `after_create` once per directory and `before_run`/`after_run` around each attempt, all
//! in the worker, in the run sandbox, once the run was admitted (approved, where the
//! `shell_exec` policy gates it), their output as run artifacts; hook timeouts and their
//! cap; the removal of a terminal item's workspace by the workers' maintenance, after
//! `before_remove`; a root `KEEL_WORKSPACE_ROOTS` does not allow; and the database
//! connections concurrent imports hold.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::tracker;
use crate::support::{Client, KeelProcess, wait_for};
use keel_client::{ItemRecord, ItemState, PollSummary, RunRecord, RunStatus, SourceRecord};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tracker::{CANARY, TOKEN_ENV, github_issue, items_of, list, register, run_of, widget_key};
use wiremock::matchers::{body_partial_json, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

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
    worker: KeelProcess,
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
        Setup::with_env(issues, &[], &[]).await
    }

    /// With more settings for the API and for the worker.
    async fn with_env(
        issues: Value,
        api_env: &[(&str, &str)],
        worker_env: &[(&str, &str)],
    ) -> Setup {
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
        let api_env = [&env[..], api_env].concat();
        let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &api_env).await;
        let data = dir.path().join("worker");
        std::fs::create_dir_all(&data).unwrap();
        let worker_env = [&env[..], worker_env].concat();
        let worker = support::spawn_worker_with_env(
            &db_url,
            dir.path(),
            "worker",
            2_000,
            &data,
            &worker_env,
        );
        Setup {
            github,
            api,
            worker,
            items: root.join("default"),
            root,
            db_url,
            allowed,
            dir,
        }
    }

    /// Kills the worker process (SIGKILL) and starts another.
    fn restart_worker(&mut self) {
        self.worker.kill9();
        let roots = ("KEEL_WORKSPACE_ROOTS", self.allowed.to_str().unwrap());
        let (db_url, dir) = (&self.db_url, self.dir.path());
        let data = dir.join("worker");
        let env = [TOKEN_ENV, roots];
        self.worker = support::spawn_worker_with_env(db_url, dir, "worker-2", 2_000, &data, &env);
    }

    fn client(&self) -> &Client {
        self.api.client.as_ref().unwrap()
    }

    async fn source(&self, markdown: &str) -> String {
        let (status, body) = register(self.client(), markdown).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        support::record::<SourceRecord>(&body).id
    }

    async fn poll(&self, source_id: &str) -> PollSummary {
        let path = format!("/v1/external-work/sources/{source_id}/poll");
        let (status, body) = self.client().post(&path, json!({})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        support::record(&body)
    }

    /// The one item of the source, the newest version first.
    async fn newest_item(&self, source_id: &str) -> ItemRecord {
        items_of(self.client(), source_id).await.pop().unwrap()
    }

    async fn finished_run(&self, item: &ItemRecord) -> RunRecord {
        let (task_id, run_id) = (item.task_id.as_deref(), item.run_id.as_deref());
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
async fn artifacts(client: &Client, run: &RunRecord) -> Vec<(String, String, String)> {
    let (task_id, run_id) = (run.task_id.as_str(), run.id.as_str());
    let listed = client.api.list_artifacts(task_id, run_id);
    let (status, listed) = listed.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{listed:?}");
    let mut found = Vec::new();
    for artifact in listed.data {
        let text = client.artifact_text(task_id, run_id, &artifact.id).await;
        found.push((artifact.name, artifact.kind.to_string(), text));
    }
    found
}

/// What a hook printed, as the item keeps it (null when none ran).
fn hook_output(item: &ItemRecord) -> Value {
    item.hook_output.clone().unwrap_or_default()
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
    assert_eq!(summary.claimed, 1, "{summary:?}");

    let workspace = setup.items.join(widget_key(1));
    let item = setup.newest_item(&id).await;
    assert_eq!(item.state, ItemState::Claimed, "{item:?}");
    assert_eq!(
        item.workspace_path.as_deref(),
        workspace.to_str(),
        "{item:?}"
    );
    // after_create runs in the worker, with the run: nothing ran in the poll.
    assert_eq!(hook_output(&item), Value::Null, "{item:?}");
    let created = workspace.join("after_create.txt");

    // The run works in the item's workspace; after_run failed, the run did not.
    let run = setup.finished_run(&item).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(std::fs::read_to_string(&created).unwrap(), "created\n");
    let artifacts = artifacts(setup.client(), &run).await;
    let path = workspace.to_str().unwrap();
    assert_eq!(text_of(&artifacts, "after_create.stdout"), "made it\n");
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
    let written = |artifacts: &[(String, String, String)]| -> Vec<(String, String)> {
        artifacts
            .iter()
            .filter(|(_, kind, _)| kind != "metadata")
            .map(|(name, kind, _)| (name.clone(), kind.clone()))
            .collect()
    };
    let expected = [
        ("after_create.stdout", "stdout"),
        ("after_create.stderr", "stderr"),
        ("before_run.stdout", "stdout"),
        ("before_run.stderr", "stderr"),
        ("stdout", "stdout"),
        ("stderr", "stderr"),
        ("after_run.stdout", "stdout"),
        ("after_run.stderr", "stderr"),
    ]
    .map(|(name, kind)| (name.to_string(), kind.to_string()));
    assert_eq!(written(&artifacts), expected, "{artifacts:?}");

    // A retry of the task works in the same, prepared, workspace: after_create does not run
    // again; before_run and after_run do.
    let (task_id, run_id) = (run.task_id.as_str(), run.id.as_str());
    let path = format!("/v1/tasks/{task_id}/runs/{run_id}/retry");
    let (status, retry) = setup.client().post(&path, json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{retry}");
    let retry_id = support::record::<RunRecord>(&retry).id;
    let timeout = Duration::from_secs(30);
    let retried = setup
        .client()
        .wait_terminal(task_id, &retry_id, timeout)
        .await;
    assert_eq!(retried.status, RunStatus::Completed, "{retried:?}");
    assert_eq!(std::fs::read_to_string(&created).unwrap(), "created\n");
    let names = written(&self::artifacts(setup.client(), &retried).await);
    assert_eq!(names[..], expected[2..], "{names:?}");
}

/// Something the worker is started with that no hook may learn.
const OPERATOR_KEY: (&str, &str) = ("OPENAI_API_KEY", "canary-operator-key-for-hooks");

#[tokio::test]
async fn a_hook_runs_as_a_run_does_and_cannot_read_the_worker_s_secrets() {
    let setup = Setup::with_env(json!([github_issue(1, "open")]), &[], &[OPERATOR_KEY]).await;
    let worker = setup.worker.pid();
    let probe = format!(
        "cat /proc/$PPID/environ /proc/1/environ /proc/{worker}/environ 2>&1; \
         for f in /proc/[0-9]*/environ; do cat $f; done 2>&1; env; kill -0 {worker} 2>&1 \
         && echo SIGNALLED; echo uid=$(id -u); true"
    );
    let hooks = format!("  after_create: '{probe}'\n  before_run: '{probe}'");
    let markdown = workflow(&setup.github, &setup.root, &hooks, "echo uid=$(id -u)");
    let id = setup.source(&markdown).await;
    setup.poll(&id).await;
    let item = setup.newest_item(&id).await;
    let run = setup.finished_run(&item).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let artifacts = artifacts(setup.client(), &run).await;
    let run_uid = text_of(&artifacts, "stdout").trim().to_string();
    assert!(
        run_uid.starts_with("uid=") && run_uid != "uid=0",
        "{run_uid}"
    );
    for hook in ["after_create.stdout", "before_run.stdout"] {
        let out = text_of(&artifacts, hook);
        for secret in [CANARY, OPERATOR_KEY.1] {
            assert!(
                !out.contains(secret),
                "{hook}: a secret reached the hook: {out}"
            );
        }
        assert!(!out.contains("SIGNALLED"), "{hook}: {out}");
        // The run's sandbox: a uid that is not the (root) worker's, as the run has.
        let uid = out.lines().last().unwrap();
        assert!(uid.starts_with("uid=") && uid != "uid=0", "{hook}: {out}");
    }
}

#[tokio::test]
async fn hooks_wait_for_the_run_s_approval_and_the_approver_sees_them() {
    let gated = [("KEEL_APPROVAL_POLICIES", "shell_exec")];
    let setup = Setup::with_env(
        json!([github_issue(1, "open"), github_issue(2, "open")]),
        &gated,
        &[],
    )
    .await;
    let hooks = "  after_create: touch created.txt
  before_remove: echo bye from $KEEL_ITEM_IDENTIFIER";
    let markdown = workflow(&setup.github, &setup.root, hooks, "echo ran");
    let id = setup.source(&markdown).await;
    let summary = setup.poll(&id).await;
    assert_eq!(summary.claimed, 2, "{summary:?}");
    // The poll prepared the directories and ran nothing: the runs wait for approval.
    let first = setup.items.join(widget_key(1));
    assert!(first.is_dir());
    assert!(!found_below(&setup.root, "created.txt"));
    let item = newest_of(setup.client(), &id, "acme/widgets#1").await;
    let run = run_of(setup.client(), &item).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval, "{run:?}");
    let task_id = item.task_id.as_deref().unwrap();
    let approvals = setup.client().api.list_task_approvals(task_id, None);
    let (status, approvals) = approvals.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{approvals:?}");
    let approval = &approvals.data[0];
    assert_eq!(approval.kind, "shell_command", "{approval:?}");
    let lines: Vec<&str> = approval.action_summary.iter().map(String::as_str).collect();
    assert_eq!(
        lines[..5],
        [
            "run the workflow hook after_create (sh -lc, at most 60000 ms):",
            "  touch created.txt",
            "run the workflow hook before_remove (sh -lc, at most 60000 ms):",
            "  echo bye from $KEEL_ITEM_IDENTIFIER",
            "run a shell command (sh -c):",
        ],
        "{approval:?}"
    );

    // Approved, the worker runs after_create, then the command.
    let approval_id = approval.id.as_str();
    let resolve = format!("/v1/tasks/{task_id}/approvals/{approval_id}/resolve");
    let approve = json!({ "decision": "approve" });
    let (status, body) = setup.client().post(&resolve, approve).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let run = setup.finished_run(&item).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert!(first.join("created.txt").exists());

    // Both close: the approved item's workspace goes after before_remove; the other's run
    // was never approved, so no hook of its source ran in its workspace, before_remove
    // included.
    let closed = |number| {
        let mut closed = github_issue(number, "closed");
        closed["updated_at"] = json!("2026-11-30T11:00:00Z");
        closed
    };
    serve(&setup.github, json!([closed(1), closed(2)])).await;
    setup.poll(&id).await;
    let second = setup.items.join(widget_key(2));
    let gone = || async { (!first.exists() && !second.exists()).then_some(()) };
    wait_for(Duration::from_secs(20), "the workspaces to go", gone).await;
    let approved = newest_of(setup.client(), &id, "acme/widgets#1").await;
    let before_remove = &hook_output(&approved)["before_remove"];
    assert_eq!(
        before_remove["stdout"], "bye from acme/widgets#1\n",
        "{approved:?}"
    );
    let never = newest_of(setup.client(), &id, "acme/widgets#2").await;
    assert_eq!(hook_output(&never), Value::Null, "{never:?}");
    assert!(!found_below(&setup.root, "created.txt"));
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
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    assert_eq!(
        run.last_error.as_deref(),
        Some("hook_failed: before_run exited with code 1: no checkout"),
        "{run:?}"
    );
    // The command never ran.
    assert!(!setup.items.join(widget_key(1)).join("ran.txt").exists());
    let artifacts = artifacts(setup.client(), &run).await;
    assert_eq!(text_of(&artifacts, "before_run.stderr"), "no checkout\n");

    // The next poll puts the item through the retry path (10 s backoff first).
    setup.poll(&id).await;
    let item = setup.newest_item(&id).await;
    assert_eq!(item.state, ItemState::RetryWait, "{item:?}");
    assert_eq!(
        item.last_error_code.as_deref(),
        Some("run_failed"),
        "{item:?}"
    );
}

/// A Linear source of project `project` whose items work under `root`.
fn linear_workflow(linear: &MockServer, project: &str, root: &Path) -> String {
    format!(
        "---
tracker:
  kind: linear
  endpoint: {}/graphql
  project_slug: {project}
  api_key: $ACME_LINEAR_API_KEY
workspace:
  root: {}
task:
  execution_kind: shell
  shell_command: pwd
---
Work on {{{{ issue.identifier }}}}
",
        linear.uri(),
        root.display()
    )
}

/// Item directories never collide: one identifier from two sources of one workspace (an
/// issue that moved from one Linear project to another) gets two directories.
#[tokio::test]
async fn one_identifier_from_two_sources_gets_two_directories() {
    let key = [("ACME_LINEAR_API_KEY", "lin_api_key_for_tests")];
    let setup = Setup::with_env(json!([]), &key, &key).await;
    let linear = MockServer::start().await;
    let issue = json!({ "id": "uuid-1", "identifier": "ENG-1", "title": "moved",
        "priority": 2, "state": { "name": "Todo" }, "updatedAt": "2026-11-30T10:00:00.000Z",
        "labels": { "nodes": [] }, "inverseRelations": { "nodes": [] } });
    let page = json!({ "data": { "issues": { "nodes": [issue],
        "pageInfo": { "hasNextPage": false, "endCursor": null } } } });
    let mut directories = Vec::new();
    for project in ["eng", "ops"] {
        Mock::given(method("POST"))
            .and(path("/graphql"))
            .and(body_partial_json(
                json!({ "variables": { "projectSlug": project } }),
            ))
            .respond_with(ResponseTemplate::new(200).set_body_json(page.clone()))
            .mount(&linear)
            .await;
        let id = setup
            .source(&linear_workflow(&linear, project, &setup.root))
            .await;
        let summary = setup.poll(&id).await;
        assert_eq!(summary.claimed, 1, "{summary:?}");
        let item = setup.newest_item(&id).await;
        let run = setup.finished_run(&item).await;
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
        directories.push(PathBuf::from(item.workspace_path.unwrap()));
    }
    assert_eq!(directories[0], setup.items.join("ENG-1"));
    assert_ne!(directories[0], directories[1]);
    let second = directories[1].file_name().unwrap().to_str().unwrap();
    assert!(second.starts_with("ENG-1--"), "{second}");
    assert!(directories.iter().all(|d| d.is_dir()), "{directories:?}");
}

/// Symphony: "workspace reuses existing issue directory without deleting local changes".
/// A directory that already holds work (its preparation marker gone) keeps it when
/// `after_create` fails there; a new directory's failed preparation is emptied again.
#[tokio::test]
async fn symphony_workspace_reuses_existing_issue_directory_without_deleting_local_changes() {
    let issues = json!([github_issue(1, "open"), github_issue(2, "open")]);
    let setup = Setup::new(issues).await;
    let reused = setup.items.join(widget_key(1));
    std::fs::create_dir_all(&reused).unwrap();
    std::fs::write(reused.join("local-change.txt"), "work in progress").unwrap();
    let hooks = "  after_create: touch partial.txt; exit 17";
    let markdown = workflow(&setup.github, &setup.root, hooks, "touch ran.txt");
    let id = setup.source(&markdown).await;
    let summary = setup.poll(&id).await;
    assert_eq!(summary.claimed, 2, "{summary:?}");
    for number in [1, 2] {
        let item = newest_of(setup.client(), &id, &format!("acme/widgets#{number}")).await;
        let run = setup.finished_run(&item).await;
        assert_eq!(run.status, RunStatus::Failed, "{run:?}");
        let error = run.last_error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("hook_failed: after_create exited with code 17"),
            "{run:?}"
        );
    }
    let kept = std::fs::read_to_string(reused.join("local-change.txt")).unwrap();
    assert_eq!(kept, "work in progress");
    assert!(reused.join("partial.txt").exists(), "nothing of it removed");
    assert!(!reused.join("ran.txt").exists(), "the command never ran");
    let new = setup.items.join(widget_key(2));
    assert!(new.is_dir(), "the directory stays");
    assert!(
        !new.join("partial.txt").exists(),
        "a new one is emptied again"
    );
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
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.last_error.as_deref().unwrap();
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
    assert_eq!(summary.claimed, 3, "{summary:?}");
    for item in items_of(setup.client(), &id).await {
        let run = setup.finished_run(&item).await;
        assert_eq!(run.status, RunStatus::Completed);
    }
    let workspace = setup.items.join(widget_key(1));
    assert!(workspace.join("work.txt").exists());
    // A link inside the workspace to a file outside it: the removal must not follow it.
    let outside = setup.root.parent().unwrap().join("keep.txt");
    std::fs::write(&outside, "kept").unwrap();
    std::os::unix::fs::symlink(&outside, workspace.join("link")).unwrap();
    // Issue 3's workspace swapped for a link to a directory outside the root.
    let elsewhere = setup.root.parent().unwrap().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("precious.txt"), "kept").unwrap();
    let swapped = setup.items.join(widget_key(3));
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
    assert_eq!(summary.terminal, 2, "{summary:?}");
    // The workers' maintenance removes it, not the poll.
    let gone = || async { (!workspace.exists()).then_some(()) };
    wait_for(Duration::from_secs(20), "the workspace to go", gone).await;
    wait_for(
        Duration::from_secs(20),
        "the link to be refused",
        || async {
            let refused = newest_of(setup.client(), &id, "acme/widgets#3").await;
            let code = refused.last_error_code.as_deref();
            (code == Some("workspace_refused")).then_some(())
        },
    )
    .await;
    assert!(elsewhere.join("precious.txt").exists());
    let refused = newest_of(setup.client(), &id, "acme/widgets#3").await;
    assert_eq!(
        refused.last_error_code.as_deref(),
        Some("workspace_refused"),
        "{refused:?}"
    );
    assert_eq!(hook_output(&refused), Value::Null, "{refused:?}");
    assert!(setup.items.join(widget_key(2)).exists());
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "kept");
    let terminal = newest_of(setup.client(), &id, "acme/widgets#1").await;
    assert_eq!(terminal.state, ItemState::Terminal, "{terminal:?}");
    assert_eq!(terminal.workspace_path, None, "{terminal:?}");
    let before_remove = &hook_output(&terminal)["before_remove"];
    assert_eq!(
        before_remove["stdout"], "bye from acme/widgets#1\nlink\nwork.txt\n",
        "{terminal:?}"
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
    let (status, body) = setup.client().post_empty(&reconcile).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(support::record::<PollSummary>(&body).terminal, 1, "{body}");
    let second = setup.items.join(widget_key(2));
    let gone = || async { (!second.exists()).then_some(()) };
    wait_for(Duration::from_secs(20), "the second workspace to go", gone).await;
    // Nothing left to ask about.
    let requests = setup.github.received_requests().await.unwrap().len();
    let (status, body) = setup.client().post_empty(&reconcile).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        setup.github.received_requests().await.unwrap().len(),
        requests
    );
}

/// Symphony: "terminal issue state stops running agent before cleaning workspace". The
/// run still writing in the workspace when its issue closes is cancelled, and the
/// workspace goes only once it stopped: `before_remove` sees a file it no longer grows.
#[tokio::test]
async fn symphony_terminal_issue_state_stops_running_agent_before_cleaning_workspace() {
    let setup = Setup::new(json!([github_issue(1, "open")])).await;
    let hooks = "  before_remove: wc -l < beats.txt; sleep 1; wc -l < beats.txt";
    let command = "while true; do echo beat >> beats.txt; sleep 0.05; done";
    let markdown = workflow(&setup.github, &setup.root, hooks, command);
    let id = setup.source(&markdown).await;
    setup.poll(&id).await;
    let workspace = setup.items.join(widget_key(1));
    let beating = || async { workspace.join("beats.txt").exists().then_some(()) };
    wait_for(Duration::from_secs(20), "the run to write", beating).await;
    let running = setup.newest_item(&id).await;

    let mut closed = github_issue(1, "closed");
    closed["updated_at"] = json!("2026-11-30T11:00:00Z");
    serve(&setup.github, json!([closed])).await;
    let summary = setup.poll(&id).await;
    assert_eq!(summary.terminal, 1, "{summary:?}");
    let gone = || async { (!workspace.exists()).then_some(()) };
    wait_for(Duration::from_secs(30), "the workspace to go", gone).await;

    let run = setup.finished_run(&running).await;
    assert_eq!(run.status, RunStatus::Cancelled, "{run:?}");
    let terminal = setup.newest_item(&id).await;
    let counted = hook_output(&terminal)["before_remove"]["stdout"].clone();
    let counts: Vec<&str> = counted.as_str().unwrap_or_default().lines().collect();
    assert_eq!(counts.len(), 2, "{terminal:?}");
    assert_eq!(
        counts[0], counts[1],
        "the run still wrote while before_remove ran"
    );
}

#[tokio::test]
async fn a_hook_timeout_over_the_cap_is_refused_at_registration() {
    let setup = Setup::new(json!([])).await;
    let hooks = "  after_create: echo hi
  timeout_ms: 999999999999";
    let markdown = workflow(&setup.github, &setup.root, hooks, "exit 0");
    let (status, body) = register(setup.client(), &markdown).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "workflow_parse_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("at most 3600000 ms"), "{message}");
    let sources = setup.client().api.list_sources().await.unwrap().data;
    assert!(sources.is_empty(), "{sources:?}");
    // One hour is the most a hook may have.
    let hour = workflow(
        &setup.github,
        &setup.root,
        "  timeout_ms: 3600000",
        "exit 0",
    );
    let (status, body) = register(setup.client(), &hour).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// The API's connections to the database now, as PostgreSQL counts them.
async fn api_connections(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'keel-api'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn concurrent_imports_hold_no_more_connections_than_the_pool() {
    const POOL: i64 = 4;
    const IMPORTS: u64 = 30;
    let dir = tempfile::tempdir().unwrap();
    let allowed = dir.path().join("allowed");
    std::fs::create_dir_all(allowed.join("items")).unwrap();
    let root = std::fs::canonicalize(allowed.join("items")).unwrap();
    let github = MockServer::start().await;
    let db_url = support::fresh_database().await;
    let env = [
        TOKEN_ENV,
        ("KEEL_WORKSPACE_ROOTS", allowed.to_str().unwrap()),
        ("KEEL_DB_MAX_CONNECTIONS", "4"),
    ];
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &env).await;
    let client = api.client.clone().unwrap();
    // Every item gets a slot, so each one's workspace is prepared under its lock.
    let hooks = "  after_create: sleep 0.3
agent:
  max_concurrent_agents: 100";
    let markdown = workflow(&github, &root, hooks, "exit 0");
    let (status, body) = register(&client, &markdown).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let source_id = support::record::<SourceRecord>(&body).id;

    let pool = support::pool(&db_url).await;
    let done = tokio_util::sync::CancellationToken::new();
    let watcher = tokio::spawn({
        let (pool, done) = (pool.clone(), done.clone());
        async move {
            let mut most = 0;
            while !done.is_cancelled() {
                most = most.max(api_connections(&pool).await);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            most
        }
    });
    let imports = (1..=IMPORTS).map(|number| {
        let (client, source_id) = (client.clone(), source_id.clone());
        async move {
            let body = json!({ "source_id": source_id, "payload": github_issue(number, "open") });
            client.post("/v1/external-work/import", body).await
        }
    });
    let answers = futures_util::future::join_all(imports).await;
    done.cancel();
    let most = watcher.await.unwrap();
    eprintln!("{IMPORTS} concurrent imports: at most {most} API connections (pool {POOL})");
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::CREATED, "{body}");
    }
    let items = items_of(&client, &source_id).await;
    assert_eq!(items.len() as u64, IMPORTS);
    assert!(
        items.iter().all(|item| item.state == ItemState::Claimed),
        "{items:?}"
    );
    assert!(most >= 1, "the API was never seen connected");
    assert!(
        most <= POOL,
        "{IMPORTS} concurrent imports held {most} connections; the pool has {POOL}"
    );
}

/// The newest version of the item `identifier`.
async fn newest_of(client: &Client, source_id: &str, identifier: &str) -> ItemRecord {
    let items = items_of(client, source_id).await;
    let mut versions = items.into_iter().filter(|i| i.identifier == identifier);
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
    assert_eq!(summary.claimed, 0, "{summary:?}");
    assert_eq!(
        summary.error_code.as_deref(),
        Some("workspace_refused"),
        "{summary:?}"
    );
    let error = summary.error.as_deref().unwrap();
    assert!(error.contains("is not beneath"), "{error}");
    let item = setup.newest_item(&id).await;
    assert_eq!(item.state, ItemState::Blocked, "{item:?}");
    assert_eq!(
        item.last_error_code.as_deref(),
        Some("workspace_refused"),
        "{item:?}"
    );
    assert_eq!(item.task_id, None, "{item:?}");
    let source = setup.client().api.get_source(&id).await.unwrap().data;
    assert_eq!(
        source.last_error_code.as_deref(),
        Some("workspace_refused"),
        "{source:?}"
    );
    let tasks = setup.client().api.list_tasks(None).await.unwrap().data;
    assert_eq!(tasks.len(), 0, "{tasks:?}");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn a_worker_killed_while_after_create_runs_leaves_it_to_the_next_attempt() {
    let mut setup = Setup::new(json!([github_issue(1, "open")])).await;
    // The first after_create hangs, after leaving a sign that it started in the workspace
    // (the only directory its sandbox can write); the next one ends.
    let hooks =
        "  after_create: if [ -e started ]; then echo again; else touch started; sleep 30; fi";
    let markdown = workflow(&setup.github, &setup.root, hooks, "pwd");
    let id = setup.source(&markdown).await;
    let summary = setup.poll(&id).await;
    assert_eq!(summary.claimed, 1, "{summary:?}");
    wait_for(Duration::from_secs(20), "after_create to start", || async {
        found_below(&setup.root, "started").then_some(())
    })
    .await;
    setup.restart_worker();

    // The next worker takes the run over once the lease lapses: the workspace was never
    // marked prepared, so after_create runs again there, then the run.
    let item = setup.newest_item(&id).await;
    let run = setup.finished_run(&item).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let workspace = setup.items.join(widget_key(1));
    let artifacts = artifacts(setup.client(), &run).await;
    assert_eq!(text_of(&artifacts, "after_create.stdout"), "again\n");
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
