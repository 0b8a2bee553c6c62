//! A repository task's `push_branch`: a completed run's workspace changes become one
//! commit by Keel, pushed with the task's credential through git's smart HTTP protocol
//! (the real `git http-backend` behind a local server), never with the run's own git hooks
//! and never over a branch that moved elsewhere; the push is gated at admission as a git
//! command that reaches a remote.

use crate::repo_workspaces::repository;
use crate::support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Response, StatusCode as HttpStatus, Uri};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use keel_client::{RunStatus, StepStatus, TaskDraft};
use tokio::io::AsyncWriteExt;

const WAIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "push-token-41d7";

/// Serves the repositories under `root` through `git http-backend` (CGI), receive-pack on,
/// answering 401 to a request without `authorization`, where runs reach it through their
/// egress proxy ([`support::RUNS_TEST_HOST`]); returns the base URL.
pub(crate) async fn serve_smart(root: &Path, authorization: String) -> String {
    type Served = (PathBuf, String);
    async fn cgi(
        State((root, authorization)): State<Served>,
        method: Method,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response<Body> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        if header("authorization") != Some(authorization.as_str()) {
            return Response::builder()
                .status(HttpStatus::UNAUTHORIZED)
                .header("www-authenticate", "Basic realm=\"repo\"")
                .body(Body::empty())
                .unwrap();
        }
        let mut backend = tokio::process::Command::new("git");
        backend
            .arg("http-backend")
            .env_clear()
            .env("GIT_PROJECT_ROOT", &root)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("REMOTE_USER", "keel")
            .env("REQUEST_METHOD", method.as_str())
            .env("PATH_INFO", uri.path())
            .env("QUERY_STRING", uri.query().unwrap_or(""))
            .env("CONTENT_LENGTH", body.len().to_string())
            .env("CONTENT_TYPE", header("content-type").unwrap_or(""))
            .env(
                "HTTP_CONTENT_ENCODING",
                header("content-encoding").unwrap_or(""),
            )
            .env("GIT_PROTOCOL", header("git-protocol").unwrap_or(""))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = backend.spawn().expect("git http-backend starts");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&body).await.unwrap();
        drop(stdin);
        let output = child.wait_with_output().await.unwrap();
        cgi_response(&output.stdout)
    }
    let app = Router::new()
        .route("/{*path}", axum::routing::any(cgi))
        .with_state((root.to_path_buf(), authorization));
    support::serve_for_runs(app).await
}

/// A CGI answer (header lines, a blank line, the body) as an HTTP response.
fn cgi_response(output: &[u8]) -> Response<Body> {
    let end = output
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| (at, at + 4))
        .or_else(|| {
            output
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|at| (at, at + 2))
        })
        .expect("CGI headers end");
    let mut response = Response::builder();
    for line in String::from_utf8_lossy(&output[..end.0]).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split(' ').next().unwrap().parse::<u16>().unwrap();
            response = response.status(code);
        } else {
            response = response.header(name, value);
        }
    }
    response.body(Body::from(output[end.1..].to_vec())).unwrap()
}

/// `git` in the bare repository `repo`, its standard output.
pub(crate) fn git_out(repo: &Path, args: &[&str]) -> String {
    let output = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(repo)
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A shell task on `url` that pushes to `branch` with the test's credential.
fn pushing(url: &str, branch: &str, command: &str) -> TaskDraft {
    TaskDraft {
        repo: Some(url.to_string()),
        repo_credential: Some("env:REPO_TEST_TOKEN".into()),
        push_branch: Some(branch.to_string()),
        ..support::shell(command)
    }
}

#[tokio::test]
async fn a_completed_runs_changes_are_pushed_to_its_branch_once_and_never_over_another() {
    let origin = repository();
    let bare = origin.path().join("repo.git");
    let expected = format!(
        "Basic {}",
        STANDARD.encode(format!("x-access-token:{TOKEN}"))
    );
    let url = format!("{}/repo.git", serve_smart(origin.path(), expected).await);
    let stack =
        crate::agent_loop::Stack::start_with("none", Vec::new(), &[("REPO_TEST_TOKEN", TOKEN)])
            .await;
    let c = &stack.client;

    // The run's own pre-commit hook would add the environment it sees: hooks are off.
    let command = "echo made > made.txt; mkdir -p hooks; \
                   printf '#!/bin/sh\\nenv > leaked.txt; git add leaked.txt\\n' > hooks/pre-commit; \
                   chmod +x hooks/pre-commit; git config core.hooksPath hooks";
    let draft = pushing(&url, "keel/result", command);
    let (task_id, run_id) = c.start_task(&draft).await;
    let run = c.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let steps = c.api.list_steps(&task_id, &run_id).await.unwrap().data;
    let push = steps.last().unwrap();
    assert_eq!(push.name, "workspace_push", "{steps:?}");
    assert_eq!(push.status, StepStatus::Completed, "{push:?}");
    let output = push.output.clone().unwrap_or_default();
    assert_eq!(output["pushed"], true, "{output}");
    let commit = output["commit"].as_str().unwrap().to_string();
    assert_eq!(git_out(&bare, &["rev-parse", "keel/result"]).trim(), commit);
    assert_eq!(git_out(&bare, &["show", "keel/result:made.txt"]), "made\n");
    let files = git_out(&bare, &["ls-tree", "-r", "--name-only", "keel/result"]);
    assert!(
        !files.contains("leaked.txt") && !files.contains(".keel"),
        "{files}"
    );
    let log = git_out(
        &bare,
        &["log", "-1", "--format=%an <%ae>%n%s", "keel/result"],
    );
    assert_eq!(
        log,
        format!("Keel <keel@localhost>\nKeel run {run_id} of task {task_id}\n")
    );
    assert_eq!(
        git_out(&bare, &["rev-parse", "keel/result~1"]),
        git_out(&bare, &["rev-parse", "main"]),
        "one commit on top of the base"
    );

    // Another run of the task makes another commit on main: the branch moved elsewhere,
    // and is not overwritten.
    let again = c.start(&task_id).await;
    let rerun = c.wait_terminal(&task_id, &again.id, WAIT).await;
    assert_eq!(rerun.status, RunStatus::Failed, "{rerun:?}");
    let error = rerun.last_error.unwrap_or_default();
    assert!(error.starts_with("push_failed: git"), "{error}");
    assert!(error.contains("rejected"), "git's own message: {error}");
    assert_eq!(git_out(&bare, &["rev-parse", "keel/result"]).trim(), commit);

    // A run that changes nothing pushes nothing.
    let (task_id, run_id) = c.start_task(&pushing(&url, "keel/nothing", "true")).await;
    let run = c.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let steps = c.api.list_steps(&task_id, &run_id).await.unwrap().data;
    let output = steps.last().unwrap().output.clone().unwrap_or_default();
    assert_eq!(output["pushed"], false, "{output}");
    assert_eq!(git_out(&bare, &["branch", "--list", "keel/nothing"]), "");
}

/// Hooks the run plants through its own git configuration (a template for new repositories,
/// a hooks path) never run with the push's credential: the push repository is made from no
/// template, no hook runs in the clone, the commit or the push, the push's jail sees only
/// that repository, and the credential reaches git at an inherited descriptor, never in an
/// environment.
#[tokio::test]
async fn a_hook_the_run_plants_never_sees_the_push_credential() {
    let origin = repository();
    let bare = origin.path().join("repo.git");
    let expected = format!(
        "Basic {}",
        STANDARD.encode(format!("x-access-token:{TOKEN}"))
    );
    let url = format!(
        "{}/repo.git",
        serve_smart(origin.path(), expected.clone()).await
    );
    let stack =
        crate::agent_loop::Stack::start_with("none", Vec::new(), &[("REPO_TEST_TOKEN", TOKEN)])
            .await;
    let c = &stack.client;
    let command = r#"ws=$(pwd); mkdir -p "$HOME/tpl/hooks"
printf '[init]\n\ttemplateDir = %s/tpl\n[core]\n\thooksPath = %s/tpl/hooks\n' "$HOME" "$HOME" > "$HOME/.gitconfig"
for hook in pre-push post-checkout reference-transaction pre-commit post-commit; do
  printf '#!/bin/sh\nenv >> %s/leaked; cat /dev/fd/3 >> %s/leaked 2>/dev/null; true\n' "$ws" "$ws" > "$HOME/tpl/hooks/$hook"
  chmod +x "$HOME/tpl/hooks/$hook"
done
echo changed > changed.txt; echo "$ws""#;
    let (task_id, run_id) = c.start_task(&pushing(&url, "keel/planted", command)).await;
    let run = c.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let steps = c.api.list_steps(&task_id, &run_id).await.unwrap().data;
    let output = steps.last().unwrap().output.clone().unwrap_or_default();
    assert_eq!(output["pushed"], true, "{output}");
    assert_eq!(
        git_out(&bare, &["show", "keel/planted:changed.txt"]),
        "changed\n"
    );
    let workspace = c.stdout(&task_id, &run_id).await;
    let leaked = Path::new(workspace.trim()).join("leaked");
    let seen = std::fs::read_to_string(&leaked).unwrap_or_default();
    for secret in [TOKEN, expected.as_str()] {
        assert!(
            !seen.contains(secret),
            "a planted hook saw the credential: {seen}"
        );
    }
    assert!(!leaked.exists(), "a planted hook ran: {seen}");
}

#[tokio::test]
async fn a_push_is_gated_at_admission_and_named_to_the_approver_and_refused_on_bad_input() {
    let app = support::TestApp::with_approvals("git_exec,network_egress").await;
    let c = &app.client;
    let draft = pushing("https://git.example.com/o/r.git", "keel/fix", "true");
    let task = c.create_task(&draft).await;
    assert_eq!(task.push_branch.as_deref(), Some("keel/fix"));
    let run = c.start(&task.id).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval);
    let approvals = c.api.list_task_approvals(&task.id, None);
    let approvals = approvals.send_with_status().await.unwrap().1.data;
    let mut kinds: Vec<&str> = approvals.iter().map(|a| a.kind.as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, ["git_exec", "network_egress"]);
    let last = approvals[0].action_summary.last().unwrap();
    assert_eq!(
        last,
        "then commit the workspace's changes and push them to branch keel/fix of \
         https://git.example.com/o/r.git"
    );

    // A clone reaches out only from a remote repository: a file task on one waits for
    // network_egress, on a local path it does not.
    for (repo, gated) in [("https://git.example.com/o/r.git", true), ("/srv/r", false)] {
        let write = TaskDraft {
            execution_kind: Some("file".into()),
            file_path: Some("notes.txt".into()),
            file_content: Some("x".into()),
            file_operation: Some("write".into()),
            repo: Some(repo.into()),
            ..TaskDraft::default()
        };
        let task = c.create_task(&write).await;
        let run = c.start(&task.id).await;
        assert_eq!(
            run.status == RunStatus::AwaitingApproval,
            gated,
            "{repo}: {run:?}"
        );
    }

    for (fields, why) in [
        (serde_json::json!({ "push_branch": "keel/x" }), "needs repo"),
        (
            serde_json::json!({ "repo": "/srv/r", "push_branch": "bad..name" }),
            "push_branch:",
        ),
        (
            serde_json::json!({ "repo": "/srv/r", "base_branch": "main", "push_branch": "main" }),
            "must differ from base_branch",
        ),
    ] {
        let mut body = serde_json::json!({ "execution_kind": "shell", "shell_command": "ls" });
        body.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        let (status, error) = c.post("/v1/tasks", body.clone()).await;
        assert_eq!(status, reqwest::StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("push_branch:") && message.contains(why),
            "{message}"
        );
    }
}
