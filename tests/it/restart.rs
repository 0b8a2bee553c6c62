//! Stop everything mid-run — API, worker and PostgreSQL itself — and start again: queued
//! and running work completes. On a cluster of its own, so restarting it disturbs no other
//! test.

use crate::support;

use std::time::Duration;

use crate::support::{shell, spawn_api, spawn_worker, wait_for};
use keel_client::RunStatus;

#[tokio::test]
async fn queued_and_running_work_completes_after_a_full_restart() {
    const RUNS: usize = 12;
    let (postgres, db) = support::private_cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let mut api = spawn_api(&db, dir.path(), "api-1").await;
    let client = api.client.clone().unwrap();
    let command = "sleep 1; echo \"$KEEL_RUN_ID\"";
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let task = client.create_task(&shell(command)).await;
        let run = client.start(&task.id).await;
        runs.push((task.id, run.id));
    }
    // One worker of concurrency 8: some runs are running, the rest still queued.
    let mut worker = spawn_worker(&db, dir.path(), "worker-1", 2_000, &dir.path().join("w"));
    let pool = support::pool(&db).await;
    wait_for(Duration::from_secs(60), "runs to be running", || async {
        let running: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'running'")
            .fetch_one(&pool)
            .await
            .unwrap();
        (running >= 4).then_some(())
    })
    .await;
    pool.close().await;

    worker.kill9();
    api.kill9();
    let postgres = tokio::task::spawn_blocking(move || postgres.restart().map(|()| postgres))
        .await
        .unwrap()
        .expect("PostgreSQL restarted");

    let api = spawn_api(&db, dir.path(), "api-2").await;
    let client = api.client.clone().unwrap();
    let _worker = spawn_worker(&db, dir.path(), "worker-2", 2_000, &dir.path().join("w"));
    for (task_id, run_id) in &runs {
        let run = client
            .wait_terminal(task_id, run_id, Duration::from_secs(120))
            .await;
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    }
    // What each run printed: its command ran to its end in the attempt that completed.
    for (task_id, run_id) in &runs {
        let stdout = client.stdout(task_id, run_id).await;
        let lines: Vec<&str> = stdout.lines().collect();
        assert!(
            !lines.is_empty() && lines.iter().all(|line| line == run_id),
            "{run_id} never ran: {stdout:?}"
        );
    }
    let pool = support::pool(&db).await;
    let finished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM run_events WHERE type = 'run.finished'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(finished, RUNS as i64);
    tokio::task::spawn_blocking(move || postgres.stop())
        .await
        .unwrap();
}
