//! Repository workspaces: a task's `repo` and `base_branch` make each run's ephemeral
//! workspace a clone, made in the run's sandbox before anything else runs there, recorded
//! as a `workspace_clone` step; a clone that fails fails the run with git's message.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode as HttpStatus;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use keel_client::{RunStatus, StepStatus, TaskDraft};
use reqwest::StatusCode;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

pub(crate) fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(["-c", "user.name=Keel", "-c", "user.email=keel@example.com"])
        .args(args)
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

/// A bare repository with a README and an AGENTS.md on `main` (its default branch) and
/// another README on `feature`, ready to be served over git's "dumb" HTTP protocol (plain
/// files) as `repo.git`.
pub(crate) fn repository() -> tempfile::TempDir {
    let work = tempfile::tempdir().unwrap();
    let repo = work.path();
    git(repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README.md"), "on main\n").unwrap();
    std::fs::write(repo.join("AGENTS.md"), "Use the Makefile.").unwrap();
    git(repo, &["add", "README.md", "AGENTS.md"]);
    git(repo, &["commit", "-q", "-m", "main"]);
    git(repo, &["checkout", "-q", "-b", "feature"]);
    std::fs::write(repo.join("README.md"), "on feature\n").unwrap();
    git(repo, &["commit", "-q", "-am", "feature"]);
    git(repo, &["checkout", "-q", "main"]);
    let bare = tempfile::tempdir().unwrap();
    let target = bare.path().join("repo.git");
    let status = Command::new("git")
        .args(["clone", "-q", "--bare"])
        .arg(repo)
        .arg(&target)
        .status()
        .unwrap();
    assert!(status.success());
    git(&target, &["update-server-info"]);
    bare
}

/// A shell task with `fields` posted raw: refused with 422, whose message this returns.
async fn refusal(c: &support::Client, fields: serde_json::Value) -> String {
    let mut body = json!({ "execution_kind": "shell", "shell_command": "ls" });
    body.as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    let (status, error) = c.post("/v1/tasks", body.clone()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {error}");
    error["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Starts a shell task whose clone of `url` must fail; returns its ids and the run's error.
async fn failed_clone(c: &support::Client, url: String) -> (String, String, String) {
    let draft = TaskDraft {
        repo: Some(url),
        ..support::shell("echo never")
    };
    let (task_id, run_id) = c.start_task(&draft).await;
    let run = c.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    (task_id, run_id, run.last_error.unwrap_or_default())
}

/// Serves `dir`'s files over HTTP where runs with network reach it through their egress
/// proxy ([`support::RUNS_TEST_HOST`]); returns the base URL.
pub(crate) async fn serve(dir: &Path) -> String {
    serve_guarded(dir, None).await
}

/// [`serve`], answering 401 to a request without `authorization` as its `Authorization`.
async fn serve_guarded(dir: &Path, authorization: Option<String>) -> String {
    type Served = (std::path::PathBuf, Option<String>);
    async fn file(
        State((root, authorization)): State<Served>,
        headers: axum::http::HeaderMap,
        UrlPath(path): UrlPath<String>,
    ) -> Result<Vec<u8>, (HttpStatus, [(&'static str, &'static str); 1])> {
        let challenge = [("www-authenticate", "Basic realm=\"repo\"")];
        let sent = headers.get("authorization").and_then(|v| v.to_str().ok());
        if authorization.is_some() && sent != authorization.as_deref() {
            return Err((HttpStatus::UNAUTHORIZED, challenge));
        }
        if path.split('/').any(|part| part == "..") {
            return Err((HttpStatus::BAD_REQUEST, challenge));
        }
        tokio::fs::read(root.join(path))
            .await
            .map_err(|_| (HttpStatus::NOT_FOUND, challenge))
    }
    let app = Router::new()
        .route("/{*path}", axum::routing::get(file))
        .with_state((dir.to_path_buf(), authorization));
    support::serve_for_runs(app).await
}

#[tokio::test]
async fn a_runs_workspace_starts_as_a_clone_of_the_tasks_repository() {
    let app = support::TestApp::start().await;
    let c = &app.client;
    let origin = repository();
    let url = format!("{}/repo.git", serve(origin.path()).await);
    let script = "cat README.md; git rev-parse --abbrev-ref HEAD";
    for (branch, expected) in [
        (Some("feature"), "on feature\nfeature\n"),
        (None, "on main\nHEAD\n"),
    ] {
        let draft = TaskDraft {
            repo: Some(url.clone()),
            base_branch: branch.map(str::to_string),
            ..support::shell(script)
        };
        let (task_id, run_id) = c.start_task(&draft).await;
        let run = c.wait_terminal(&task_id, &run_id, WAIT).await;
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
        assert_eq!(c.stdout(&task_id, &run_id).await, expected);
        let steps = c.api.list_steps(&task_id, &run_id).await.unwrap().data;
        assert_eq!(steps[0].name, "workspace_clone", "{steps:?}");
        assert_eq!(steps[0].status, StepStatus::Completed);
        assert_eq!(steps[0].input["repo"], url.as_str());
    }
}

/// A repository on this host, beneath `KEEL_SANDBOX_READ_ONLY_PATHS` and owned by another
/// uid than the run's (git refuses such a repository unless protected configuration trusts
/// it), is cloned into a run's workspace in the `isolated` sandbox.
#[tokio::test]
async fn a_repository_on_this_host_is_cloned_in_the_sandbox() {
    let origin = repository();
    support::let_the_sandbox_through(origin.path());
    let shared = origin.path().to_str().unwrap();
    let stack = crate::agent_loop::Stack::start_with(
        "none",
        Vec::new(),
        &[("KEEL_SANDBOX_READ_ONLY_PATHS", shared)],
    )
    .await;
    let c = &stack.client;
    let path = origin.path().join("repo.git");
    let draft = TaskDraft {
        repo: Some(path.to_str().unwrap().to_string()),
        ..support::shell("cat README.md")
    };
    let (task_id, run_id) = c.start_task(&draft).await;
    let run = c.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(c.stdout(&task_id, &run_id).await, "on main\n");
}

#[tokio::test]
async fn a_clone_that_fails_fails_the_run_with_gits_message() {
    let app = support::TestApp::start().await;
    let c = &app.client;
    let missing = tempfile::tempdir().unwrap();
    let url = missing
        .path()
        .join("nothing-here")
        .to_str()
        .unwrap()
        .to_string();
    let (task_id, run_id, error) = failed_clone(c, url).await;
    assert!(
        error.starts_with("clone_failed: git exited with code"),
        "{error}"
    );
    assert!(error.contains("nothing-here"), "git's own message: {error}");
    let steps = c.api.list_steps(&task_id, &run_id).await.unwrap().data;
    assert_eq!(steps.len(), 1, "nothing ran after the clone: {steps:?}");
    assert_eq!(steps[0].name, "workspace_clone");
    assert_eq!(steps[0].status, StepStatus::Failed);
}

#[tokio::test]
async fn repositories_are_named_without_credentials_and_only_for_ephemeral_workspaces() {
    let app = support::TestApp::api_only().await;
    let c = &app.client;
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            json!({ "repo": "https://user:ghp_secret@github.com/o/r.git" }),
            "repo",
        ),
        (json!({ "repo": "--upload-pack=touch /tmp/x" }), "repo"),
        (json!({ "repo": "relative/path" }), "repo"),
        (json!({ "repo": "ext::sh -c id" }), "repo"),
        (json!({ "base_branch": "main" }), "base_branch"),
        (
            json!({ "repo": "/srv/repo", "base_branch": "bad..name" }),
            "base_branch",
        ),
        (
            json!({ "repo": "/srv/repo", "base_branch": "-x" }),
            "base_branch",
        ),
        (
            json!({ "repo": "/srv/repo", "workspace_mode": "in_place",
                    "working_directory": dir.path() }),
            "repo",
        ),
    ];
    for (fields, named) in cases {
        let message = refusal(c, fields).await;
        assert!(message.starts_with(&format!("{named}:")), "{message}");
    }
    for repo in [
        "https://github.com/o/r.git",
        "ssh://git@github.com/o/r.git",
        "git@github.com:o/r.git",
        "/srv/repo",
    ] {
        let draft = TaskDraft {
            repo: Some(repo.into()),
            base_branch: Some("release/1.2".into()),
            ..support::shell("ls")
        };
        let task = c.create_task(&draft).await;
        assert_eq!(task.repo.as_deref(), Some(repo));
        assert_eq!(task.base_branch.as_deref(), Some("release/1.2"));
    }
}

#[tokio::test]
async fn a_private_repository_is_cloned_with_its_credential_which_the_run_never_sees() {
    const TOKEN: &str = "repo-token-9e2c51";
    let origin = repository();
    // GitHub's convention for a token alone: basic authentication as x-access-token.
    let expected = format!(
        "Basic {}",
        STANDARD.encode(format!("x-access-token:{TOKEN}"))
    );
    let url = format!(
        "{}/repo.git",
        serve_guarded(origin.path(), Some(expected)).await
    );
    let stack =
        crate::agent_loop::Stack::start_with("none", Vec::new(), &[("REPO_TEST_TOKEN", TOKEN)])
            .await;
    let c = &stack.client;
    let script = "cat README.md; git config --list --show-origin; env";
    let draft = TaskDraft {
        repo: Some(url.clone()),
        repo_credential: Some("env:REPO_TEST_TOKEN".into()),
        ..support::shell(script)
    };
    let (task_id, run_id) = c.start_task(&draft).await;
    let run = c.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let stdout = c.stdout(&task_id, &run_id).await;
    assert!(stdout.starts_with("on main\n"), "{stdout}");
    let encoded = STANDARD.encode(format!("x-access-token:{TOKEN}"));
    for leaked in [TOKEN, encoded.as_str(), "extraheader", "REPO_TEST_TOKEN"] {
        assert!(
            !stdout.to_lowercase().contains(&leaked.to_lowercase()),
            "{leaked}: {stdout}"
        );
    }
    let task = c.api.get_task(&task_id).await.unwrap().data;
    assert_eq!(task.repo_credential.as_deref(), Some("env:REPO_TEST_TOKEN"));

    // Without it, the server refuses the clone and the run fails with git's message.
    let (_, _, error) = failed_clone(c, url).await;
    assert!(error.starts_with("clone_failed: git"), "{error}");

    // A credential is a secret reference, for an HTTP(S) repository only.
    for (fields, why) in [
        (
            json!({ "repo_credential": "env:REPO_TEST_TOKEN" }),
            "needs repo",
        ),
        (
            json!({ "repo": "git@github.com:o/r.git", "repo_credential": "env:REPO_TEST_TOKEN" }),
            "https://",
        ),
        (
            json!({ "repo": "https://github.com/o/r.git", "repo_credential": "ghp_raw" }),
            "secret reference",
        ),
        (
            json!({ "repo": "https://github.com/o/r.git", "repo_credential": "env:DATABASE_URL" }),
            "Keel's own settings",
        ),
    ] {
        let message = refusal(c, fields).await;
        assert!(
            message.starts_with("repo_credential:") && message.contains(why),
            "{message}"
        );
    }
}
