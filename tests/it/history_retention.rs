//! History retention (`KEEL_HISTORY_RETENTION_DAYS`): a worker's maintenance deletes events
//! and state transitions older than the retention, but each run's last event, and nothing
//! younger.

use std::time::Duration;

use crate::support::{KeelProcess, TestApp, spawn_worker_with_env, wait_for};

const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// The task's history as 40 days of age would leave it.
async fn backdate(app: &TestApp, task: &str) {
    for table in ["run_events", "state_transitions"] {
        let backdate = format!(
            "UPDATE {table} SET occurred_at = occurred_at - interval '40 days' WHERE task_id = $1"
        );
        let moved = sqlx::query(sqlx::AssertSqlSafe(backdate))
            .bind(task)
            .execute(&app.pool)
            .await
            .unwrap();
        assert!(moved.rows_affected() > 1, "{table}");
    }
}

/// A worker whose maintenance keeps 30 days of history, passing every 200 ms.
fn retention_worker(app: &TestApp, dir: &std::path::Path) -> KeelProcess {
    let env = [
        ("KEEL_HISTORY_RETENTION_DAYS", "30"),
        ("KEEL_RECONCILE_INTERVAL_MS", "200"),
    ];
    spawn_worker_with_env(&app.db_url, dir, "retention", 2_000, dir, &env)
}

#[tokio::test]
async fn old_events_and_transitions_go_but_each_runs_last_event_and_young_history_stay() {
    let app = TestApp::start().await;
    let c = &app.client;
    let (old_task, old_run) = c.run_shell("echo old").await;
    let (young_task, young_run) = c.run_shell("echo young").await;
    for (task, run) in [(&old_task, &old_run), (&young_task, &young_run)] {
        c.wait_terminal(task, run, RUN_TIMEOUT).await;
    }
    let young_events = c.events(&young_task, &young_run).await;
    let old_events = c.events(&old_task, &old_run).await;
    let old_last = old_events.last().unwrap().clone();
    backdate(&app, &old_task).await;
    let dir = tempfile::tempdir().unwrap();
    let _worker = retention_worker(&app, dir.path());
    let count = |table: &'static str, task: String| {
        let pool = app.pool.clone();
        async move {
            let query = format!("SELECT count(*) FROM {table} WHERE task_id = $1");
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(query))
                .bind(task)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    wait_for(Duration::from_secs(30), "the old history to go", || async {
        let events = count("run_events", old_task.clone()).await;
        let transitions = count("state_transitions", old_task.clone()).await;
        (events == 1 && transitions == 0).then_some(())
    })
    .await;

    // The run's last event stays, with its number: a stream resumes after it.
    let kept = c.events(&old_task, &old_run).await;
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        (kept[0].sequence, &kept[0].event_type),
        (old_last.sequence, &old_last.event_type)
    );
    // The young task's history is whole.
    let young_now = c.events(&young_task, &young_run).await;
    assert_eq!(young_now.len(), young_events.len());
    assert!(count("state_transitions", young_task.clone()).await > 1);
}

/// Two replicas' passes may reach the same rows: each deletes only rows no other holds
/// (`SKIP LOCKED`), so a pass never waits for another (here, a transaction holding one old
/// event and one old transition, as another pass's delete would) and leaves it those rows.
#[tokio::test]
async fn a_retention_pass_skips_the_rows_another_holds_instead_of_waiting() {
    let app = TestApp::start().await;
    let c = &app.client;
    let (task, run) = c.run_shell("echo old").await;
    c.wait_terminal(&task, &run, RUN_TIMEOUT).await;
    backdate(&app, &task).await;
    let mut holder = app.pool.begin().await.unwrap();
    let held_event: i64 = sqlx::query_scalar(
        "SELECT id FROM run_events WHERE task_id = $1 ORDER BY sequence LIMIT 1 FOR UPDATE",
    )
    .bind(&task)
    .fetch_one(&mut *holder)
    .await
    .unwrap();
    let held_transition: i64 = sqlx::query_scalar(
        "SELECT id FROM state_transitions WHERE task_id = $1 ORDER BY id LIMIT 1 FOR UPDATE",
    )
    .bind(&task)
    .fetch_one(&mut *holder)
    .await
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let _worker = retention_worker(&app, dir.path());
    let left = || async {
        let events: Vec<i64> = sqlx::query_scalar("SELECT id FROM run_events WHERE task_id = $1")
            .bind(&task)
            .fetch_all(&app.pool)
            .await
            .unwrap();
        let transitions: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM state_transitions WHERE task_id = $1")
                .bind(&task)
                .fetch_all(&app.pool)
                .await
                .unwrap();
        (events, transitions)
    };
    // While the rows are held: everything else old goes (the run's last event stays).
    let (events, transitions) = wait_for(
        Duration::from_secs(30),
        "the unheld history to go",
        || async {
            let (events, transitions) = left().await;
            (events.len() == 2 && transitions.len() == 1).then_some((events, transitions))
        },
    )
    .await;
    assert!(events.contains(&held_event), "{events:?}");
    assert_eq!(transitions, [held_transition]);
    holder.rollback().await.unwrap();
}
