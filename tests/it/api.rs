//! The HTTP API against a real Postgres, with Keel's API and a worker in this process.

use crate::support;

use std::time::Duration;

use crate::support::{Client, SseReader, TestApp, shell, wait_for};
use keel::domain::Caller;
use keel::events::FeedCursor;
use keel::queue::Locked;
use keel_client::{
    ArtifactRecord, ArtifactStatus, EventRecord, EventType, RunRecord, RunStatus, StepStatus,
    TaskDraft, TaskStatus, TerminalCode,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

const RUN_TIMEOUT: Duration = Duration::from_secs(30);

fn event_types(events: &[EventRecord]) -> Vec<&str> {
    events.iter().map(|e| e.event_type.as_str()).collect()
}

#[tokio::test]
async fn a_shell_run_goes_from_created_to_completed_with_its_output() {
    let app = TestApp::start().await;
    let c = &app.client;
    let task = c.create_task(&shell("echo hello; echo warn >&2")).await;
    assert_eq!(task.status, TaskStatus::NotStarted);
    assert_eq!(task.latest_run_id, None);
    let task_id = task.id.as_str();

    let (status, body) = c
        .post(&format!("/v1/tasks/{task_id}/start"), json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["object"], "task_run");
    let run: RunRecord = support::record(&body);
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.number, 1);
    let run_id = run.id.as_str();

    let run = c.wait_terminal(task_id, run_id, RUN_TIMEOUT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.terminal_code, Some(TerminalCode::Completed));
    assert_eq!(run.exit_code, Some(0));
    assert_eq!(run.attempt, 1);
    assert!(run.worker_id.as_deref().unwrap().starts_with("wrk_"));

    let task = c.api.get_task(task_id).await.unwrap().data;
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.latest_run_id.as_deref(), Some(run_id));
    assert_eq!(task.latest_run_step_count, 1);
    assert_eq!(task.latest_run_artifact_count, 2);

    let events = c.events(task_id, run_id).await;
    let types = event_types(&events);
    assert_eq!(
        types,
        [
            "run.created",
            "task.updated",
            "run.queued",
            "task.updated",
            "run.started",
            "step.started",
            "artifact.created",
            "artifact.created",
            "step.finished",
            "task.updated",
            "run.finished"
        ]
    );
    let sequences: Vec<i64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(sequences, (1..=11).collect::<Vec<_>>());
    // The task's status follows its run's, each change just before the run event.
    let task_statuses: Vec<&str> = events
        .iter()
        .filter(|e| e.event_type == EventType::TaskUpdated)
        .map(|e| e.data["status"].as_str().unwrap())
        .collect();
    assert_eq!(task_statuses, ["queued", "running", "completed"]);

    let steps = c.api.list_steps(task_id, run_id).await.unwrap().data;
    assert_eq!(steps[0].name, "shell");
    assert_eq!(steps[0].status, StepStatus::Completed);

    let artifacts = c.api.list_artifacts(task_id, run_id).await.unwrap().data;
    let by_name = |name: &str| artifacts.iter().find(|a| a.name == name).unwrap().clone();
    let stdout = by_name("stdout");
    assert_eq!(stdout.size_bytes, 6);
    assert_eq!(stdout.status, ArtifactStatus::Complete);
    // keel-client has no operation reading one artifact's record.
    let path = format!("/v1/tasks/{task_id}/runs/{run_id}/artifacts/{}", stdout.id);
    let (status, one) = c.get(&path).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(support::record::<ArtifactRecord>(&one).id, stdout.id);
    let content = c.artifact_text(task_id, run_id, &stdout.id).await;
    assert_eq!(content, "hello\n");
    let stderr_id = by_name("stderr").id;
    assert_eq!(c.artifact_text(task_id, run_id, &stderr_id).await, "warn\n");
}

#[tokio::test]
async fn a_failing_command_fails_the_run_with_exit_code_and_stderr() {
    let app = TestApp::start().await;
    let (task_id, run_id) = app
        .client
        .run_shell("echo 'disk is full' >&2; exit 3")
        .await;
    let run = app
        .client
        .wait_terminal(&task_id, &run_id, RUN_TIMEOUT)
        .await;
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.exit_code, Some(3));
    assert_eq!(
        run.last_error.as_deref(),
        Some("process exited with code 3: disk is full")
    );
    assert_eq!(run.terminal_code, Some(TerminalCode::ExitedNonzero));
    let events = app.client.events(&task_id, &run_id).await;
    assert_eq!(event_types(&events).last(), Some(&"run.failed"));
    assert_eq!(events.last().unwrap().data["exit_code"], 3);
}

#[tokio::test]
async fn a_timeout_fails_the_run() {
    let app = TestApp::start().await;
    let draft = TaskDraft {
        timeout_ms: Some(300),
        ..shell("sleep 30")
    };
    let task = app.client.create_task(&draft).await;
    let run = app.client.start(&task.id).await;
    let run = app
        .client
        .wait_terminal(&task.id, &run.id, RUN_TIMEOUT)
        .await;
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.last_error.as_deref(), Some("timed out after 300 ms"));
    assert_eq!(run.terminal_code, Some(TerminalCode::TimedOut));
    // Read back as the run's field, and named in `runs show`.
    let shown = crate::cli::cli(&app.client.base, &["runs", "show", &run.id]).await;
    let shown = crate::cli::stdout(&shown);
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("terminal code") && l.ends_with("timed_out")),
        "{shown}"
    );
}

#[tokio::test]
async fn file_and_git_runs_work_in_their_workspace() {
    let app = TestApp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let directory = dir.path().to_str().unwrap();
    let c = &app.client;
    let in_place = TaskDraft {
        workspace_mode: Some("in_place".into()),
        working_directory: Some(directory.into()),
        ..TaskDraft::default()
    };
    let file = |operation: &str, content: &str| TaskDraft {
        execution_kind: Some("file".into()),
        file_path: Some("docs/a.txt".into()),
        file_operation: Some(operation.into()),
        file_content: Some(content.into()),
        ..in_place.clone()
    };
    let tasks = [
        file("write", "one\n"),
        file("append", "two\n"),
        TaskDraft {
            execution_kind: Some("git".into()),
            git_command: Some("init -q 'new repo'".into()),
            ..in_place.clone()
        },
    ];
    for draft in tasks {
        let task = c.create_task(&draft).await;
        let run = c.start(&task.id).await;
        let run = c.wait_terminal(&task.id, &run.id, RUN_TIMEOUT).await;
        assert_eq!(run.status, RunStatus::Completed, "{task:?}: {run:?}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("docs/a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert!(dir.path().join("new repo/.git").is_dir());

    // An ephemeral run gets a fresh directory of its own under the data directory.
    let (task_id, run_id) = c.run_shell("pwd; echo x > made-here").await;
    assert_eq!(
        c.wait_terminal(&task_id, &run_id, RUN_TIMEOUT).await.status,
        RunStatus::Completed
    );
    let workspace = app.data_dir.path().join("workspaces").join(&run_id);
    assert!(
        workspace.join("made-here").is_file(),
        "{}",
        workspace.display()
    );
}

#[tokio::test]
async fn a_task_created_with_start_is_queued_in_the_same_commit_and_runs() {
    let app = TestApp::start().await;
    let c = &app.client;
    let draft = TaskDraft {
        start: Some(true),
        ..shell("echo started")
    };
    let task = c.create_task(&draft).await;
    assert_eq!(task.status, TaskStatus::Queued, "{task:?}");
    assert_eq!(task.run_count, 1);
    let run_id = task
        .latest_run_id
        .clone()
        .expect("the run it was started with");
    let run = c.wait_terminal(&task.id, &run_id, RUN_TIMEOUT).await;
    assert_eq!(
        (run.status, run.number),
        (RunStatus::Completed, 1),
        "{run:?}"
    );
    let events = c.events(&task.id, &run_id).await;
    assert_eq!(
        event_types(&events)[..5],
        [
            "run.created",
            "task.updated",
            "run.queued",
            "task.updated",
            "run.started"
        ]
    );

    // A start the admission refuses leaves no task behind: both are one transaction.
    let count = "SELECT count(*) FROM tasks";
    let tasks_before: i64 = sqlx::query_scalar(count)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let refused = json!({ "execution_kind": "agent_loop", "prompt": "hi", "start": true });
    let (status, body) = c.post("/v1/tasks", refused).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "model_not_configured", "{body}");
    let tasks_after: i64 = sqlx::query_scalar(count)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(tasks_after, tasks_before);
}

#[tokio::test]
async fn a_task_has_the_title_it_was_given_or_one_from_what_it_runs() {
    let app = TestApp::start().await;
    let c = &app.client;
    let titled = |title: &str, draft: TaskDraft| TaskDraft {
        title: Some(title.into()),
        ..draft
    };
    let given = c
        .create_task(&titled("  Nightly cleanup ", shell("true")))
        .await;
    assert_eq!(given.title, "Nightly cleanup");
    let long = format!("echo {}\necho second line", "x".repeat(100));
    let derived = [
        (
            shell("  echo   hello\tthere \n echo again"),
            "echo hello there".to_string(),
        ),
        (shell(&long), format!("echo {}…", "x".repeat(75))),
        (
            support::agent_loop("Tidy the notes.\nThen stop."),
            "Tidy the notes.".into(),
        ),
    ];
    for (draft, title) in derived {
        let task = c.create_task(&draft).await;
        assert_eq!(task.title, title);
        // The list shows it as the task does.
        let listed = c.api.list_tasks(None).await.unwrap().data;
        let row = listed.iter().find(|t| t.id == task.id).unwrap();
        assert_eq!(row.title, title);
    }
    let refused = [
        ("   ".to_string(), "is blank"),
        ("a\nb".into(), "control character"),
        ("é".repeat(201), "200 characters"),
    ];
    for (title, message) in refused {
        let body = json!({ "execution_kind": "shell", "shell_command": "true", "title": title });
        let (status, body) = c.post("/v1/tasks", body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let said = body["error"]["message"].as_str().unwrap();
        assert!(said.contains("title") && said.contains(message), "{body}");
    }
    // 200 characters of two bytes each are within the limit: it counts characters.
    let most = c
        .create_task(&titled(&"é".repeat(200), shell("true")))
        .await;
    assert_eq!(most.title.chars().count(), 200);
}

#[tokio::test]
async fn a_started_tasks_response_is_what_reading_it_returns() {
    // Both runs wait: one for a worker, one for the approval its shell command needs.
    let waiting = [
        (TestApp::api_only().await, "queued"),
        (
            TestApp::with_approvals("shell_exec").await,
            "awaiting_approval",
        ),
    ];
    for (app, waits) in waiting {
        let draft = json!({ "execution_kind": "shell", "shell_command": "true", "start": true });
        let (status, created) = app.client.post("/v1/tasks", draft).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        let path = format!("/v1/tasks/{}", created["data"]["id"].as_str().unwrap());
        let (_, read) = app.client.get(&path).await;
        assert_eq!(created, read);
        assert_eq!(read["data"]["status"], waits, "{read}");
    }
}

#[tokio::test]
async fn twenty_parallel_starts_create_exactly_one_run() {
    let app = TestApp::api_only().await;
    let task = app.client.create_task(&shell("true")).await;
    let path = format!("/v1/tasks/{}/start", task.id);
    let starts = (0..20).map(|_| {
        let client = app.client.clone();
        let path = path.clone();
        tokio::spawn(async move { client.post(&path, json!({})).await })
    });
    let mut created = 0;
    for start in futures_util::future::join_all(starts).await {
        let (status, body) = start.unwrap();
        match status {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => assert_eq!(body["error"]["type"], "conflict"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(created, 1);
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(runs, 1);
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM queue_jobs")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(jobs, 1);
}

#[tokio::test]
async fn the_database_refuses_a_second_active_run() {
    let app = TestApp::api_only().await;
    let task = app.client.create_task(&shell("true")).await;
    let task_id = task.id.as_str();
    app.client.start(task_id).await;
    let second = sqlx::query(
        "INSERT INTO runs (id, task_id, number, status, workspace_id)
         VALUES ('run_x', $1, 2, 'running', 'default')",
    )
    .bind(task_id)
    .execute(&app.pool)
    .await;
    let error = second.unwrap_err();
    assert!(
        error.to_string().contains("runs_one_active_per_task"),
        "{error}"
    );
}

#[tokio::test]
async fn idempotency_key_returns_the_original_run_or_conflicts() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let task = c.create_task(&shell("true")).await;
    let url = format!("{}/v1/tasks/{}/start", c.base, task.id);
    let start = |key: &str, body: Value| {
        c.send(c.http.post(&url).header("Idempotency-Key", key).json(&body))
    };
    let (status, first) = start("k1", json!({ "reason": "deploy" })).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, again) = start("k1", json!({ "reason": "deploy" })).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        support::record::<RunRecord>(&again).id,
        support::record::<RunRecord>(&first).id
    );
    let (status, different) = start("k1", json!({ "reason": "other" })).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        different["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key")
    );
    // Visible ASCII only, as the document's pattern says: no spaces inside.
    let (status, spaced) = start("two words", json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{spaced}");
    assert_eq!(spaced["error"]["type"], "invalid_request", "{spaced}");
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(runs, 1);
}

#[tokio::test]
async fn retry_creates_a_new_run_only_when_none_is_active() {
    let app = TestApp::start().await;
    let c = &app.client;
    let (task_id, run_id) = c.run_shell("exit 1").await;
    assert_eq!(
        c.wait_terminal(&task_id, &run_id, RUN_TIMEOUT).await.status,
        RunStatus::Failed
    );

    let (status, body) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/{run_id}/retry"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let retry: RunRecord = support::record(&body);
    assert_eq!(retry.number, 2);
    assert_eq!(retry.retried_from_run_id, Some(run_id));

    let runs = c.api.list_runs(&task_id).query("limit", Some(1));
    let (status, runs) = runs.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(runs.data.len(), 1);
    assert!(runs.has_more);
    let cursor = runs.next_cursor.unwrap();
    let rest = c.api.list_runs(&task_id).query("limit", Some(10));
    let rest = rest.query("cursor", Some(cursor)).await.unwrap();
    assert!(!rest.has_more);
    assert_eq!(rest.data[0].number, 2);
}

#[tokio::test]
async fn retry_while_a_run_is_active_conflicts() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let (task_id, run_id) = c.run_shell("true").await;
    let (status, body) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/{run_id}/retry"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, _) = c
        .post(
            &format!("/v1/tasks/{task_id}/runs/run_missing/retry"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn cancel_stops_a_running_process_tree_within_seconds() {
    let app = TestApp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let c = &app.client;
    let task = c
        .create_task(&support::in_place(
            dir.path(),
            "echo $$ > shell.pid; sleep 600 & echo $! > sleep.pid; wait",
        ))
        .await;
    let task_id = task.id.as_str();
    let run = c.start(task_id).await;
    let run_id = run.id.as_str();
    c.wait_status(task_id, run_id, RunStatus::Running, RUN_TIMEOUT)
        .await;
    // The pids the shell wrote are its PID namespace's; the host finds the tree by the
    // home directory its environment names, inside the workspace.
    let home = format!("HOME={}", dir.path().join(".keel/home").display());
    let pids: Vec<i32> = wait_for(RUN_TIMEOUT, "the pid files", || async {
        let written = ["shell.pid", "sleep.pid"].map(|name| dir.path().join(name).exists());
        let pids = support::processes_with_env(&home);
        (written.iter().all(|w| *w) && pids.len() >= 2).then_some(pids)
    })
    .await;
    assert!(pids.iter().all(|pid| is_running(*pid)));
    // The worker writes a step's row with its next durable write, or within ~200 ms.
    wait_for(RUN_TIMEOUT, "the running step", || async {
        let steps = c.api.list_steps(task_id, run_id).await.unwrap().data;
        let first = steps.first().map(|s| s.status);
        (first == Some(StepStatus::Running)).then_some(())
    })
    .await;

    let cancelled_at = std::time::Instant::now();
    let (status, body) = c
        .post_empty(&format!("/v1/tasks/{task_id}/runs/{run_id}/cancel"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        support::record::<RunRecord>(&body).status,
        RunStatus::Cancelled
    );
    wait_for(
        Duration::from_secs(5),
        "the process tree to die",
        || async { pids.iter().all(|pid| !is_running(*pid)).then_some(()) },
    )
    .await;
    println!("cancel → process tree gone in {:?}", cancelled_at.elapsed());

    let run = c.run(task_id, run_id).await;
    assert_eq!(run.status, RunStatus::Cancelled);
    let steps = c.api.list_steps(task_id, run_id).await.unwrap().data;
    assert_eq!(steps[0].status, StepStatus::Cancelled);
    let events = c.events(task_id, run_id).await;
    assert_eq!(
        event_types(&events)
            .iter()
            .filter(|t| **t == "run.cancelled")
            .count(),
        1
    );
    // Cancelling a finished run is a no-op that returns it.
    let (status, again) = c
        .post_empty(&format!("/v1/tasks/{task_id}/runs/{run_id}/cancel"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        support::record::<RunRecord>(&again).finished_at,
        run.finished_at
    );
    // The worker wrote nothing after the cancellation.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.events(task_id, run_id).await.len(), events.len());
}

/// A cancel removes the job row a second time once it holds the run lock, skipping a row
/// another transaction holds (a worker's heartbeat, at that moment). The worker holding the
/// job must still stop and clear it, or the lease would be renewed as long as the process
/// runs.
#[tokio::test]
async fn a_cancel_that_finds_the_job_row_locked_still_stops_the_worker() {
    let app = TestApp::start().await;
    let c = &app.client;
    let task = c.create_task(&shell("sleep 600")).await;
    let task_id = task.id.as_str();
    let run = c.start(task_id).await;
    let run_id = run.id.as_str();
    c.wait_status(task_id, run_id, RunStatus::Running, RUN_TIMEOUT)
        .await;

    let mut heartbeat = app.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM queue_jobs WHERE ref_id = $1 FOR UPDATE")
        .bind(run_id)
        .fetch_one(&mut *heartbeat)
        .await
        .unwrap();
    let mut cancel = app.pool.begin().await.unwrap();
    let reason = Some("cancelled by the test");
    let change = keel::runs::Change::default();
    let cancelled = keel::domain::RunStatus::Cancelled;
    let (scope, actor) = (Caller::local().scope, Caller::local().actor());
    keel::runs::transition(
        &mut cancel,
        &scope,
        run_id,
        cancelled,
        change,
        &actor,
        reason,
    )
    .await
    .unwrap();
    keel::queue::remove(&mut cancel, &scope, "run", run_id, Locked::Skip)
        .await
        .unwrap();
    cancel.commit().await.unwrap();
    heartbeat.commit().await.unwrap();

    let outcome: String = wait_for(RUN_TIMEOUT, "the worker to ack the job", || async {
        sqlx::query_scalar("SELECT outcome FROM lease_history WHERE ref_id = $1")
            .bind(run_id)
            .fetch_optional(&app.pool)
            .await
            .unwrap()
    })
    .await;
    assert_eq!(outcome, "acked");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM queue_jobs WHERE ref_id = $1")
        .bind(run_id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
    assert_eq!(c.run(task_id, run_id).await.status, RunStatus::Cancelled);
}

fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn delete_refuses_while_a_run_is_active_then_removes_everything() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let (task_id, run_id) = c.run_shell("true").await;
    let (status, body) = c.delete(&format!("/v1/tasks/{task_id}")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    c.api.cancel_run(&task_id, &run_id).await.unwrap();
    let (status, body) = c.delete(&format!("/v1/tasks/{task_id}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        c.get(&format!("/v1/tasks/{task_id}")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        c.get(&format!("/v1/tasks/{task_id}/runs/{run_id}")).await.0,
        StatusCode::NOT_FOUND
    );
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM runs) + (SELECT count(*) FROM run_events)",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn task_list_paginates_and_filters_by_status() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(c.create_task(&shell("true")).await.id);
    }
    for started in [0, 2, 4] {
        c.start(&ids[started]).await;
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(every_page_of_tasks(c, None).await, newest_first);
    // An active status is read from the active runs, paged by task as the rest.
    let queued = every_page_of_tasks(c, Some("queued")).await;
    assert_eq!(queued, [ids[4].clone(), ids[2].clone(), ids[0].clone()]);
    assert!(every_page_of_tasks(c, Some("running")).await.is_empty());
    // Any other status is filtered after the join, and pages the same way.
    let not_started = every_page_of_tasks(c, Some("not_started")).await;
    assert_eq!(not_started, [ids[3].clone(), ids[1].clone()]);
}

/// The ids of the tasks listed with `status`, read two to a page by following the cursor;
/// every one has that status.
async fn every_page_of_tasks(c: &Client, status: Option<&str>) -> Vec<String> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let list = c.api.list_tasks(status).query("limit", Some(2));
        let (code, page) = list
            .query("cursor", cursor.take())
            .send_with_status()
            .await
            .unwrap();
        assert_eq!(code, StatusCode::OK);
        for task in page.data {
            if let Some(status) = status {
                assert_eq!(task.status.as_str(), status, "{}", task.id);
            }
            seen.push(task.id);
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return seen,
        }
    }
}

/// Every refusal carries the envelope and the request id.
async fn assert_refused(
    c: &Client,
    request: reqwest::RequestBuilder,
    status: StatusCode,
    kind: &str,
    mention: &str,
) {
    let response = request.send().await.unwrap();
    let header_id = response
        .headers()
        .get("x-request-id")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(response.status(), status, "expected {status} for {mention}");
    let body: Value = response.json().await.unwrap();
    let error = &body["error"];
    assert_eq!(error["type"], kind, "{body}");
    for field in ["message", "user_message", "operator_action", "request_id"] {
        assert!(
            error[field].as_str().is_some_and(|s| !s.is_empty()),
            "{field} missing in {body}"
        );
    }
    assert_eq!(header_id.as_deref(), error["request_id"].as_str());
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(mention),
        "'{message}' should mention '{mention}'"
    );
    let _ = c;
}

#[tokio::test]
async fn bad_input_gets_a_4xx_with_the_envelope() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let url = |path: &str| format!("{}{path}", c.base);
    let post_json = |body: &str| {
        c.http
            .post(url("/v1/tasks"))
            .header("content-type", "application/json")
            .body(body.to_string())
    };
    let bad = StatusCode::BAD_REQUEST;
    let unprocessable = StatusCode::UNPROCESSABLE_ENTITY;
    assert_refused(
        c,
        post_json("{bad"),
        bad,
        "invalid_request",
        "malformed JSON",
    )
    .await;
    assert_refused(
        c,
        c.http.post(url("/v1/tasks")).body("{}"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "invalid_request",
        "Content-Type",
    )
    .await;
    assert_refused(
        c,
        post_json(r#"{"execution_kind":"shell","shell_command":"true","colour":1}"#),
        unprocessable,
        "invalid_request",
        "colour",
    )
    .await;
    assert_refused(
        c,
        post_json(r#"{"execution_kind":"shell","shell_command":42}"#),
        unprocessable,
        "invalid_request",
        "shell_command",
    )
    .await;
    assert_refused(
        c,
        post_json(r#"{"execution_kind":"shell","priority":"high"}"#),
        unprocessable,
        "invalid_request",
        "priority",
    )
    .await;
    assert_refused(
        c,
        post_json(r#"{}"#),
        unprocessable,
        "invalid_request",
        "execution_kind",
    )
    .await;
    assert_refused(
        c,
        post_json(r#"{"execution_kind":"shell"}"#),
        unprocessable,
        "invalid_request",
        "shell_command",
    )
    .await;
    assert_refused(
        c,
        post_json(r#"{"execution_kind":"teleport"}"#),
        unprocessable,
        "invalid_request",
        "teleport",
    )
    .await;
    assert_refused(c, post_json(r#"{"execution_kind":"shell","shell_command":"true","workspace_mode":"in_place","working_directory":"rel/dir"}"#), unprocessable, "invalid_request", "working_directory").await;
    assert_refused(c, post_json(r#"{"execution_kind":"shell","shell_command":"true","workspace_mode":"in_place","working_directory":"/tmp/../etc"}"#), unprocessable, "invalid_request", "working_directory").await;
    assert_refused(c, post_json(r#"{"execution_kind":"file","file_path":"../../etc/passwd","file_operation":"write","file_content":"x"}"#), unprocessable, "invalid_request", "file_path").await;
    assert_refused(c, post_json(r#"{"execution_kind":"file","file_path":"/etc/passwd","file_operation":"write","file_content":"x"}"#), unprocessable, "invalid_request", "file_path").await;
    assert_refused(
        c,
        post_json(r#"{"execution_kind":"file","file_path":"a","file_operation":"chmod"}"#),
        unprocessable,
        "invalid_request",
        "chmod",
    )
    .await;
    assert_refused(
        c,
        post_json(r#"{"execution_kind":"shell","shell_command":"true","timeout_ms":-5}"#),
        unprocessable,
        "invalid_request",
        "timeout_ms",
    )
    .await;
    let huge = format!(
        r#"{{"execution_kind":"shell","shell_command":"{}"}}"#,
        "x".repeat(3 * 1024 * 1024)
    );
    assert_refused(
        c,
        post_json(&huge),
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request",
        "length limit",
    )
    .await;

    assert_refused(
        c,
        c.http.get(url("/v1/tasks/task_nope")),
        StatusCode::NOT_FOUND,
        "not_found",
        "task",
    )
    .await;
    assert_refused(
        c,
        c.http.delete(url("/v1/tasks/task_nope")),
        StatusCode::NOT_FOUND,
        "not_found",
        "task",
    )
    .await;
    assert_refused(
        c,
        c.http.post(url("/v1/tasks/task_nope/start")),
        StatusCode::NOT_FOUND,
        "not_found",
        "task",
    )
    .await;
    assert_refused(
        c,
        c.http.get(url("/v1/tasks/task_nope/runs")),
        StatusCode::NOT_FOUND,
        "not_found",
        "task",
    )
    .await;
    assert_refused(
        c,
        c.http.get(url("/v1/nowhere")),
        StatusCode::NOT_FOUND,
        "not_found",
        "/v1/nowhere",
    )
    .await;
    assert_refused(
        c,
        c.http.put(url("/v1/tasks")),
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request",
        "PUT",
    )
    .await;
    assert_refused(
        c,
        c.http.get(url("/v1/tasks?limit=0")),
        bad,
        "invalid_request",
        "limit",
    )
    .await;
    assert_refused(
        c,
        c.http.get(url("/v1/tasks?limit=abc")),
        bad,
        "invalid_request",
        "limit",
    )
    .await;
    assert_refused(
        c,
        c.http.get(url("/v1/tasks?status=sleeping")),
        bad,
        "invalid_request",
        "sleeping",
    )
    .await;
    assert_refused(
        c,
        c.http.get(url("/v1/tasks?colour=red")),
        bad,
        "invalid_request",
        "colour",
    )
    .await;
    assert_refused(
        c,
        c.http.get(url("/v1/events?after=-1")),
        bad,
        "invalid_request",
        "after",
    )
    .await;

    let (task_id, run_id) = c.run_shell("true").await;
    let run = |rest: &str| url(&format!("/v1/tasks/{task_id}/runs/{rest}"));
    assert_refused(
        c,
        c.http.get(run("run_nope")),
        StatusCode::NOT_FOUND,
        "not_found",
        "run",
    )
    .await;
    assert_refused(
        c,
        c.http.post(run("run_nope/cancel")),
        StatusCode::NOT_FOUND,
        "not_found",
        "run",
    )
    .await;
    assert_refused(
        c,
        c.http.get(run("run_nope/steps")),
        StatusCode::NOT_FOUND,
        "not_found",
        "run",
    )
    .await;
    assert_refused(
        c,
        c.http.get(run("run_nope/events")),
        StatusCode::NOT_FOUND,
        "not_found",
        "run",
    )
    .await;
    assert_refused(
        c,
        c.http.get(run("run_nope/stream")),
        StatusCode::NOT_FOUND,
        "not_found",
        "run",
    )
    .await;
    assert_refused(
        c,
        c.http.get(run(&format!("{run_id}/artifacts/art_nope"))),
        StatusCode::NOT_FOUND,
        "not_found",
        "artifact",
    )
    .await;
    assert_refused(
        c,
        c.http
            .get(run(&format!("{run_id}/artifacts/art_nope/content"))),
        StatusCode::NOT_FOUND,
        "not_found",
        "artifact",
    )
    .await;
    assert_refused(
        c,
        c.http.get(run(&format!("{run_id}/steps?cursor=x"))),
        bad,
        "invalid_request",
        "cursor",
    )
    .await;
    assert_refused(
        c,
        c.http
            .get(run(&format!("{run_id}/stream")))
            .header("Last-Event-ID", "abc"),
        bad,
        "invalid_request",
        "Last-Event-ID",
    )
    .await;
    assert_refused(
        c,
        c.http
            .post(run(&format!("{run_id}/retry")))
            .header("content-type", "application/json")
            .body(r#"{"why":1}"#),
        bad,
        "invalid_request",
        "why",
    )
    .await;
    // A run of another task is not found under this one.
    let (other_task, _) = c.run_shell("true").await;
    let foreign = url(&format!("/v1/tasks/{other_task}/runs/{run_id}"));
    assert_refused(
        c,
        c.http.get(foreign),
        StatusCode::NOT_FOUND,
        "not_found",
        "run",
    )
    .await;
}

#[tokio::test]
async fn health_readiness_and_stats() {
    let app = TestApp::start().await;
    let c = &app.client;
    let (status, health) = c.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health["status"], "ok");
    let (status, ready) = c.get("/readyz").await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    assert_eq!(ready["migrations"], "current");
    let stats = wait_for(
        Duration::from_secs(10),
        "the worker to register",
        || async {
            let stats = c.api.system_stats().await.unwrap().data;
            (stats.workers.live == 1).then_some(stats)
        },
    )
    .await;
    assert_eq!(stats.queue_backend, "postgres");
    // The local caller operates the runtime: it sees where its workers run.
    let worker = &stats.workers.list[0];
    assert!(
        worker.hostname.as_ref().is_some_and(|h| !h.is_empty()),
        "{worker:?}"
    );
    assert!(worker.pid.is_some_and(|pid| pid > 0), "{worker:?}");
    // A queued job shows in the depth while no worker can take it.
    let api = TestApp::api_only().await;
    api.client.run_shell("true").await;
    let stats = api.client.api.system_stats().await.unwrap().data;
    assert_eq!(stats.queue[0].kind, "run");
    assert_eq!(stats.queue[0].depth, 1);
    assert!(stats.queue[0].oldest_age_ms.unwrap() >= 0);
}

#[tokio::test]
async fn run_stream_replays_in_order_and_resumes_after_last_event_id() {
    let app = TestApp::start().await;
    let c = &app.client;
    let (task_id, run_id) = c
        .run_shell("for i in 1 2 3; do echo $i; sleep 0.1; done")
        .await;
    let path = format!("/v1/tasks/{task_id}/runs/{run_id}/stream");
    let mut stream = SseReader::open(c, &path, None).await;
    let mut received = Vec::new();
    while let Some(event) = stream.next(RUN_TIMEOUT).await {
        received.push(event);
    }
    let sequences: Vec<i64> = received
        .iter()
        .map(|e| e.data["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(sequences, (1..=received.len() as i64).collect::<Vec<_>>());
    assert_eq!(
        received.last().unwrap().event.as_deref(),
        Some("run.finished"),
        "the stream ends after the run"
    );
    for event in &received {
        assert_eq!(
            event.id.as_deref(),
            Some(event.data["sequence"].to_string().as_str())
        );
        assert_eq!(event.event.as_deref(), event.data["type"].as_str());
    }
    let mut resumed = SseReader::open(c, &path, Some("3")).await;
    let mut rest = Vec::new();
    while let Some(event) = resumed.next(RUN_TIMEOUT).await {
        rest.push(event.data["sequence"].as_i64().unwrap());
    }
    assert_eq!(rest, (4..=received.len() as i64).collect::<Vec<_>>());
}

#[tokio::test]
async fn public_feed_filters_and_streams() {
    let app = TestApp::start().await;
    let c = &app.client;
    let (task_a, run_a) = c.run_shell("true").await;
    let (task_b, run_b) = c.run_shell("exit 1").await;
    c.wait_terminal(&task_a, &run_a, RUN_TIMEOUT).await;
    c.wait_terminal(&task_b, &run_b, RUN_TIMEOUT).await;

    let ends = "/v1/events?event_type=run.finished,run.failed";
    let ends = c.feed_when(ends, |events| events.len() == 2).await;
    // keel-client has no operation for the feed: its pages are read raw.
    let (_, all) = c.get("/v1/events?limit=200").await;
    let all = support::page::<EventRecord>(&all).data;
    let cursors: Vec<&str> = all.iter().map(|e| e.cursor.as_str()).collect();
    let position = |cursor: &str| FeedCursor::parse(cursor).unwrap();
    assert!(cursors.windows(2).all(|w| position(w[0]) < position(w[1])));
    let types: Vec<EventType> = ends.data.iter().map(|e| e.event_type).collect();
    assert_eq!(types.len(), 2);
    assert!(types.contains(&EventType::RunFinished) && types.contains(&EventType::RunFailed));
    let (_, only_b) = c
        .get(&format!(
            "/v1/events?task_id={task_b}&event_type=run.failed"
        ))
        .await;
    let only_b = support::page::<EventRecord>(&only_b).data;
    assert_eq!(only_b.len(), 1);
    assert_eq!(only_b[0].run_id, Some(run_b));
    let after = cursors[2];
    let (_, later) = c.get(&format!("/v1/events?after={after}&limit=1")).await;
    let later = support::page::<EventRecord>(&later);
    assert_eq!(later.data[0].cursor, cursors[3]);
    assert_eq!(later.next_cursor.as_deref(), Some(cursors[3]));
    assert!(later.has_more);

    // The live feed: replay from a cursor, then a new run's events as they happen.
    let mut feed = SseReader::open(
        c,
        "/v1/events/stream?event_type=run.created,run.finished",
        Some(after),
    )
    .await;
    let first = feed.next(RUN_TIMEOUT).await.unwrap();
    assert!(position(first.data["cursor"].as_str().unwrap()) > position(after));
    assert_eq!(first.id.as_deref(), first.data["cursor"].as_str());
    let (task_c, run_c) = c.run_shell("true").await;
    let mut seen_finish = false;
    while let Some(event) = feed.next(RUN_TIMEOUT).await {
        if event.data["run_id"] == run_c.as_str() && event.event.as_deref() == Some("run.finished")
        {
            seen_finish = true;
            break;
        }
        assert!(matches!(
            event.event.as_deref(),
            Some("run.created" | "run.finished")
        ));
    }
    assert!(seen_finish, "the feed delivered the new run's end");
    let _ = task_c;
}

#[tokio::test]
async fn output_is_readable_while_the_run_writes_it() {
    let app = TestApp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let c = &app.client;
    let task = c
        .create_task(&support::in_place(
            dir.path(),
            "echo first; while [ ! -f go ]; do sleep 0.05; done; echo second",
        ))
        .await;
    let task_id = task.id.as_str();
    let run = c.start(task_id).await;
    let run_id = run.id.as_str();
    let content = wait_for(RUN_TIMEOUT, "stdout to hold the first line", || async {
        let list = c.api.list_artifacts(task_id, run_id).await.ok()?.data;
        let stdout = list.into_iter().find(|a| a.name == "stdout")?;
        let content = c.api.artifact_content(task_id, run_id, &stdout.id);
        let text = String::from_utf8_lossy(&content.raw().await.ok()?).into_owned();
        (!text.is_empty()).then_some((stdout, text))
    })
    .await;
    assert_eq!(content.1, "first\n");
    assert_eq!(content.0.status, ArtifactStatus::Writing);
    assert_eq!(c.run(task_id, run_id).await.status, RunStatus::Running);
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(
        c.wait_terminal(task_id, run_id, RUN_TIMEOUT).await.status,
        RunStatus::Completed
    );
}
