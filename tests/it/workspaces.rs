//! Confined workspaces with real `keel api` and `keel worker` processes: `in_place`
//! directories only beneath KEEL_WORKSPACE_ROOTS (symbolic links resolved, the data
//! directory never), narrowed per task by `sandbox_allowed_root` and checked again by the
//! worker; file runs that cannot leave their workspace; ephemeral workspaces removed when
//! their retention ends, after which resume answers 409 `workspace_expired`.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{Client, KeelProcess, spawn_api_with_env, spawn_worker_with_env, wait_for};
use keel_client::{RunRecord, RunStatus, TaskDraft};
use reqwest::StatusCode;
use serde_json::json;

const SOON: Duration = Duration::from_secs(30);

/// An API and a worker sharing a root (`<tmp>/root`) and a data directory inside it, so
/// that the data directory's refusal is not just "outside the roots".
struct Stack {
    client: Client,
    root: PathBuf,
    data: PathBuf,
    /// A directory outside every root.
    outside: tempfile::TempDir,
    _api: KeelProcess,
    _worker: KeelProcess,
    _dir: tempfile::TempDir,
}

async fn stack() -> Stack {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let env = [
        ("KEEL_WORKSPACE_ROOTS", root.to_str().unwrap()),
        ("KEEL_DATA_DIR", data.to_str().unwrap()),
        ("KEEL_WORKSPACE_RETENTION_MS", "1000"),
    ];
    let api = spawn_api_with_env(&db, dir.path(), "api", &env).await;
    let worker = spawn_worker_with_env(&db, dir.path(), "worker", 30_000, &data, &env);
    Stack {
        client: api.client.clone().unwrap(),
        root,
        data,
        outside: tempfile::tempdir().unwrap(),
        _api: api,
        _worker: worker,
        _dir: dir,
    }
}

fn text(path: &Path) -> Option<String> {
    Some(path.to_str().unwrap().to_string())
}

fn in_place(directory: &Path) -> TaskDraft {
    support::in_place(directory, "true")
}

/// Posts the task and checks the 422 envelope names `field`.
async fn assert_refused(client: &Client, draft: TaskDraft, field: &str) -> String {
    let body = support::wire(&draft);
    let (status, response) = client.post("/v1/tasks", body.clone()).await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{body}: {response}"
    );
    assert_eq!(response["error"]["type"], "invalid_request", "{response}");
    let message = response["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains(field), "{field} not named in {message}");
    message
}

async fn run_to_end(client: &Client, draft: TaskDraft) -> RunRecord {
    let (task_id, run_id) = client.start_task(&draft).await;
    client.wait_terminal(&task_id, &run_id, SOON).await
}

#[tokio::test]
async fn in_place_is_refused_without_roots() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let api = spawn_api_with_env(
        &db,
        dir.path(),
        "api",
        &[("KEEL_DATA_DIR", data.to_str().unwrap())],
    )
    .await;
    let client = api.client.clone().unwrap();
    let message = assert_refused(&client, in_place(dir.path()), "working_directory").await;
    assert!(message.contains("KEEL_WORKSPACE_ROOTS"), "{message}");
}

#[tokio::test]
async fn in_place_directories_stay_beneath_the_roots() {
    let s = stack().await;
    let c = &s.client;
    let inside = s.root.join("project");
    std::fs::create_dir_all(inside.join("sub")).unwrap();
    std::os::unix::fs::symlink(s.outside.path(), s.root.join("escape")).unwrap();

    assert_refused(c, in_place(s.outside.path()), "working_directory").await;
    assert_refused(c, in_place(Path::new("/")), "working_directory").await;
    assert_refused(c, in_place(&s.root.join("escape")), "working_directory").await;
    assert_refused(c, in_place(&s.data), "working_directory").await;
    std::fs::create_dir_all(s.data.join("workspaces/run_x")).unwrap();
    assert_refused(
        c,
        in_place(&s.data.join("workspaces/run_x")),
        "working_directory",
    )
    .await;
    assert_refused(c, in_place(&s.root.join("missing")), "working_directory").await;

    // A task may narrow the roots, never widen them.
    let narrowed = |directory: &Path, allowed: &Path| TaskDraft {
        sandbox_allowed_root: text(allowed),
        ..in_place(directory)
    };
    assert_refused(
        c,
        narrowed(&inside, s.outside.path()),
        "sandbox_allowed_root",
    )
    .await;
    assert_refused(
        c,
        narrowed(&inside, &s.root.join("escape")),
        "sandbox_allowed_root",
    )
    .await;
    assert_refused(c, narrowed(&s.root, &inside), "working_directory").await;
    let task = c.create_task(&narrowed(&inside.join("sub"), &inside)).await;
    assert_eq!(task.sandbox_allowed_root, text(&inside), "{task:?}");
    let ephemeral = TaskDraft {
        sandbox_allowed_root: text(&inside),
        ..support::shell("true")
    };
    assert_refused(c, ephemeral, "sandbox_allowed_root").await;

    // Beside that task's directory, not above it (which would contain it).
    assert_refused(c, in_place(&inside), "working_directory").await;
    let run = run_to_end(c, in_place(&inside.join("sub"))).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
}

#[tokio::test]
async fn the_worker_checks_the_directory_again_before_the_run() {
    let s = stack().await;
    let c = &s.client;
    let project = s.root.join("project");
    std::fs::create_dir_all(&project).unwrap();
    let draft = TaskDraft {
        shell_command: Some("echo escaped > x".into()),
        ..in_place(&project)
    };
    let task = c.create_task(&draft).await;
    let task_id = task.id.as_str();
    // Accepted while it was a directory inside; now it leads out.
    std::fs::remove_dir(&project).unwrap();
    std::os::unix::fs::symlink(s.outside.path(), &project).unwrap();
    let (status, run) = c
        .post(&format!("/v1/tasks/{task_id}/start"), json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let run_id = support::record::<RunRecord>(&run).id;
    let run = c.wait_terminal(task_id, &run_id, SOON).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.last_error.as_deref().unwrap();
    assert!(
        error.starts_with("workspace_refused: working_directory"),
        "{error}"
    );
    assert_eq!(std::fs::read_dir(s.outside.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn file_runs_cannot_write_outside_their_workspace() {
    let s = stack().await;
    let c = &s.client;
    let workspace = s.root.join("files");
    std::fs::create_dir_all(&workspace).unwrap();
    let outside = s.outside.path();
    std::fs::write(outside.join("secret"), "original").unwrap();
    std::os::unix::fs::symlink(outside, workspace.join("dirlink")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), workspace.join("filelink")).unwrap();
    std::fs::hard_link(outside.join("secret"), workspace.join("hardlink")).unwrap();
    let file = |path: &str, operation: &str| TaskDraft {
        execution_kind: Some("file".into()),
        file_path: Some(path.into()),
        file_operation: Some(operation.into()),
        file_content: Some("overwritten".into()),
        workspace_mode: Some("in_place".into()),
        working_directory: text(&workspace),
        ..TaskDraft::default()
    };

    assert_refused(c, file("../x", "write"), "file_path").await;
    let (symlink, hard_link) = ("symbolic link", "hard links");
    for (path, operation, why) in [
        ("dirlink/x", "write", symlink),
        ("dirlink/new/x", "write", symlink),
        ("filelink", "write", symlink),
        ("filelink", "append", symlink),
        ("hardlink", "write", hard_link),
        ("hardlink", "append", hard_link),
    ] {
        let run = run_to_end(c, file(path, operation)).await;
        assert_eq!(run.status, RunStatus::Failed, "{path} {operation}: {run:?}");
        let error = run.last_error.as_deref().unwrap();
        assert!(error.contains(why), "{path} {operation}: {error}");
    }
    let mut names: Vec<_> = std::fs::read_dir(outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["secret"], "nothing new outside");
    assert_eq!(
        std::fs::read_to_string(outside.join("secret")).unwrap(),
        "original"
    );

    // Inside, intermediate directories are created one by one and the write lands.
    let run = run_to_end(c, file("a/b/c.txt", "write")).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(
        std::fs::read_to_string(workspace.join("a/b/c.txt")).unwrap(),
        "overwritten"
    );
}

#[tokio::test]
async fn retention_removes_a_finished_workspace_and_resume_then_conflicts() {
    let s = stack().await;
    let c = &s.client;
    let (task_id, run_id) = c.run_shell("echo kept > kept.txt").await;
    let run = c.wait_terminal(&task_id, &run_id, SOON).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let workspace = s.data.join("workspaces").join(&run_id);
    wait_for(SOON, "the sweep to remove the workspace", || async {
        (!workspace.exists()).then_some(())
    })
    .await;
    // The mark commits with the removal, under the task's lock the resume also takes.
    let (status, body) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/{run_id}/resume"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["type"], "workspace_expired", "{body}");
}

#[tokio::test]
async fn a_persistent_workspace_is_cloned_once_kept_across_runs_and_removed_with_its_task() {
    let s = stack().await;
    let c = &s.client;
    let origin = crate::repo_workspaces::repository();
    let url = format!(
        "{}/repo.git",
        crate::repo_workspaces::serve(origin.path()).await
    );
    let draft = TaskDraft {
        workspace_mode: Some("persistent".into()),
        repo: Some(url),
        ..support::shell("cat README.md; echo run >> runs.log; wc -l < runs.log")
    };
    let task = c.create_task(&draft).await;
    assert_eq!(task.workspace_mode, "persistent");
    let mut clones = Vec::new();
    for expected in ["on main\n1\n", "on main\n2\n", "on main\n3\n"] {
        let run = c.start(&task.id).await;
        let run = c.wait_terminal(&task.id, &run.id, SOON).await;
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
        assert_eq!(c.stdout(&task.id, &run.id).await, expected);
        let steps = c.api.list_steps(&task.id, &run.id).await.unwrap().data;
        clones.push(steps.iter().filter(|s| s.name == "workspace_clone").count());
    }
    assert_eq!(clones, [1, 0, 0], "cloned by the first run only");
    // Kept by the sweeps that remove ephemeral workspaces (one second after their run)...
    let workspace = s.data.join("workspaces").join(&task.id);
    let (other_task, other_run) = c.run_shell("true").await;
    c.wait_terminal(&other_task, &other_run, SOON).await;
    let ephemeral = s.data.join("workspaces").join(&other_run);
    wait_for(SOON, "a sweep to remove an ephemeral workspace", || async {
        (!ephemeral.exists()).then_some(())
    })
    .await;
    assert!(
        workspace.join("runs.log").exists(),
        "kept while its task exists"
    );
    // ...and removed once its task is deleted.
    let (status, body) = c.delete(&format!("/v1/tasks/{}", task.id)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    wait_for(
        SOON,
        "the sweep to remove the deleted task's workspace",
        || async { (!workspace.exists()).then_some(()) },
    )
    .await;
}
