//! Real `keel api` and `keel worker` processes on one database: crash takeover, fencing of
//! a paused worker, SSE across API processes, graceful shutdown.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use crate::support::{
    Client, KeelProcess, SseReader, spawn_api, spawn_api_with_approvals, spawn_worker,
    spawn_worker_with_env, wait_for, worker_id_of,
};
use chrono::{DateTime, Utc};
use keel_client::{EventType, RunRecord, RunStatus};
use nix::sys::signal::Signal;
use serde_json::json;
use sqlx::PgPool;

const LONG: Duration = Duration::from_secs(180);

/// The jobs a worker holds, each with when its lease runs out.
async fn leases_of(pool: &PgPool, worker_id: &str) -> HashMap<String, DateTime<Utc>> {
    sqlx::query_as("SELECT ref_id, lease_expires_at FROM queue_jobs WHERE lease_owner = $1")
        .bind(worker_id)
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Creates a shell task running `command` and starts it (201); returns (task id, run id).
async fn start_task(client: &Client, command: &str) -> (String, String) {
    let task = client.create_task(&support::shell(command)).await;
    let (status, run) = client
        .post(&format!("/v1/tasks/{}/start", task.id), json!({}))
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{run}");
    (task.id, support::record::<RunRecord>(&run).id)
}

/// Approves every pending approval, as an operator working through the inbox would.
async fn approve_all(client: &Client, expected: usize) {
    let mut approved = 0;
    loop {
        let pending = client.api.list_approvals(Some("pending"));
        let pending = pending.query("limit", Some(200)).await.unwrap().data;
        if pending.is_empty() {
            break;
        }
        for approval in pending {
            let path = format!(
                "/v1/tasks/{}/approvals/{}/resolve",
                approval.task_id, approval.id
            );
            let (status, body) = client.post(&path, json!({ "decision": "approve" })).await;
            assert_eq!(status, reqwest::StatusCode::OK, "{body}");
            approved += 1;
        }
    }
    assert_eq!(approved, expected);
}

async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Workers whose runs may append to the test's file of executions, outside their
/// workspaces: the count of executions per run is what this test is about, and the sandbox
/// (which would keep the runs inside) has tests of its own (tests/sandbox.rs,
/// tests/hostile_runs.rs).
const COUNTED: [(&str, &str); 1] = [("KEEL_SANDBOX", "off")];

#[tokio::test]
async fn killing_a_worker_mid_run_loses_nothing() {
    const RUNS: usize = 200;
    const LEASE_MS: u64 = 3_000;
    // The survivors' own leases are not under test: long enough that a loaded machine's
    // late heartbeat never makes one of them give a run up (and run it again).
    const SURVIVOR_LEASE_MS: u64 = 10_000;
    let db = support::fresh_database().await;
    let pool = support::pool(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let ids_file = dir.path().join("ids.txt");
    // Approvals on (the default policy gates shell runs): every run is approved below.
    let api =
        spawn_api_with_approvals(&db, dir.path(), "api", "shell_exec,git_exec,file_write").await;
    let client = api.client.clone().unwrap();

    let command = format!(
        "sleep 0.5; echo \"$KEEL_RUN_ID\" >> '{}'",
        ids_file.display()
    );
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        runs.push(start_task(&client, &command).await);
    }

    approve_all(&client, RUNS).await;

    let mut victim = spawn_worker_with_env(
        &db,
        dir.path(),
        "worker-1",
        LEASE_MS,
        &dir.path().join("w1"),
        &COUNTED,
    );
    let survivors = [
        spawn_worker_with_env(
            &db,
            dir.path(),
            "worker-2",
            SURVIVOR_LEASE_MS,
            &dir.path().join("w2"),
            &COUNTED,
        ),
        spawn_worker_with_env(
            &db,
            dir.path(),
            "worker-3",
            SURVIVOR_LEASE_MS,
            &dir.path().join("w3"),
            &COUNTED,
        ),
    ];
    let victim_id = worker_id_of(&pool, &victim).await;
    wait_for(
        Duration::from_secs(60),
        "the victim to be running several processes",
        || async {
            // Output artifacts are opened right before the process starts: once both
            // exist, the command is (about to be) running on the victim.
            let running: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM runs r WHERE r.worker_id = $1 AND r.status = 'running'
                   AND (SELECT count(*) FROM artifacts a WHERE a.run_id = r.id) = 2",
            )
            .bind(&victim_id)
            .fetch_one(&pool)
            .await
            .unwrap();
            (running >= 4).then_some(())
        },
    )
    .await;
    victim.kill9();
    let killed_at = db_now(&pool).await;
    // Until their leases expire, the rows still name the dead owner: exactly what it held,
    // and when each lease runs out (no heartbeat moves it any more).
    let held = leases_of(&pool, &victim_id).await;
    assert!(!held.is_empty());

    for (task_id, run_id) in &runs {
        let run = client.wait_terminal(task_id, run_id, LONG).await;
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    }

    let finished: Vec<(String, i64)> = sqlx::query_as(
        "SELECT run_id, count(*) FROM run_events WHERE type = 'run.finished' GROUP BY run_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(finished.len(), RUNS);
    assert!(
        finished.iter().all(|(_, n)| *n == 1),
        "exactly one run.finished per run"
    );

    let written = std::fs::read_to_string(&ids_file).unwrap();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for line in written.lines() {
        *counts.entry(line).or_default() += 1;
    }
    for (_, run_id) in &runs {
        let n = counts.get(run_id.as_str()).copied().unwrap_or(0);
        assert!(n >= 1, "run {run_id} never executed");
        assert!(
            n == 1 || held.contains_key(run_id),
            "run {run_id} executed {n} times but was not held by the killed worker"
        );
    }

    // The killed worker's runs were taken over by the others, after the lease expired.
    let mut takeovers = Vec::new();
    for (run_id, expired_at) in &held {
        let (worker, started): (String, DateTime<Utc>) = sqlx::query_as(
            "SELECT r.worker_id, (SELECT max(occurred_at) FROM run_events e
                                  WHERE e.run_id = r.id AND e.type = 'run.started')
             FROM runs r WHERE r.id = $1",
        )
        .bind(run_id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_ne!(
            worker, victim_id,
            "run {run_id} finished by the dead worker"
        );
        assert!(
            started >= *expired_at,
            "run {run_id} was taken over at {started}, before its lease ran out at {expired_at}"
        );
        takeovers.push((started - killed_at).num_milliseconds());
    }
    takeovers.sort();
    let duplicated = counts.values().filter(|n| **n > 1).count();
    println!(
        "crash test: {RUNS} runs, 3 workers, 1 killed holding {} jobs; {duplicated} re-executed; \
         takeover after kill: min {} ms, max {} ms (lease {LEASE_MS} ms)",
        held.len(),
        takeovers[0],
        takeovers[takeovers.len() - 1]
    );
    drop(survivors);
}

#[tokio::test]
async fn a_paused_worker_cannot_change_a_run_after_its_lease_was_taken() {
    let db = support::fresh_database().await;
    let pool = support::pool(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let api = spawn_api(&db, dir.path(), "api").await;
    let client = api.client.clone().unwrap();
    let stale = spawn_worker(&db, dir.path(), "worker-a", 1_500, &dir.path().join("a"));
    let stale_id = worker_id_of(&pool, &stale).await;

    let (task_id, run_id) = start_task(&client, "sleep 2; echo done").await;
    client
        .wait_status(&task_id, &run_id, RunStatus::Running, LONG)
        .await;
    stale.signal(Signal::SIGSTOP);

    let fresh = spawn_worker(&db, dir.path(), "worker-b", 1_500, &dir.path().join("b"));
    let fresh_id = worker_id_of(&pool, &fresh).await;
    let run = client.wait_terminal(&task_id, &run_id, LONG).await;
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.worker_id.as_ref(), Some(&fresh_id));
    assert_eq!(run.attempt, 2);
    let events_before = client.events(&task_id, &run_id).await;

    stale.signal(Signal::SIGCONT);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(&stale.log).unwrap_or_default();
        if log.contains("lease lost") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the paused worker never noticed its lost lease:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events_after = client.events(&task_id, &run_id).await;
    assert_eq!(
        events_after.len(),
        events_before.len(),
        "the stale worker wrote events"
    );
    assert_eq!(
        client.run(&task_id, &run_id).await,
        run,
        "the stale worker changed the run"
    );
    let types: Vec<EventType> = events_after.iter().map(|e| e.event_type).collect();
    let finished = types.iter().filter(|t| **t == EventType::RunFinished);
    assert_eq!(finished.count(), 1);
    let gap = events_after
        .iter()
        .find(|e| e.event_type == EventType::GapRunDisconnected)
        .unwrap();
    assert_eq!(gap.data["previous_worker_id"], stale_id.as_str());
}

#[tokio::test]
async fn a_stream_on_another_api_process_sees_every_event_in_order() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let api_a = spawn_api(&db, dir.path(), "api-a").await;
    let api_b = spawn_api(&db, dir.path(), "api-b").await;
    let (a, b) = (api_a.client.clone().unwrap(), api_b.client.clone().unwrap());
    let _worker = spawn_worker(&db, dir.path(), "worker", 5_000, &dir.path().join("w"));

    let command = "for i in $(seq 1 5); do echo line $i; sleep 0.1; done";
    let (task_id, run_id) = start_task(&a, command).await;
    let path = format!("/v1/tasks/{task_id}/runs/{run_id}/stream");
    let mut stream = SseReader::open(&b, &path, None).await;
    let mut seen = Vec::new();
    while let Some(event) = stream.next(LONG).await {
        seen.push(event);
    }
    let sequences: Vec<i64> = seen
        .iter()
        .map(|e| e.data["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(sequences, (1..=seen.len() as i64).collect::<Vec<_>>());
    assert_eq!(seen.last().unwrap().event.as_deref(), Some("run.finished"));
    let listed: Vec<String> = a
        .events(&task_id, &run_id)
        .await
        .iter()
        .map(|e| e.event_id.clone())
        .collect();
    let streamed: Vec<String> = seen
        .iter()
        .map(|e| e.data["event_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, listed);

    let middle = seen.len() / 2;
    let mut resumed = SseReader::open(&b, &path, Some(&middle.to_string())).await;
    let mut rest = Vec::new();
    while let Some(event) = resumed.next(LONG).await {
        rest.push(event.data["event_id"].as_str().unwrap().to_string());
    }
    assert_eq!(rest, streamed[middle..]);
}

#[tokio::test]
async fn sigterm_drains_then_hands_unfinished_runs_back() {
    let db = support::fresh_database().await;
    let pool = support::pool(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let api = spawn_api(&db, dir.path(), "api").await;
    let client = api.client.clone().unwrap();
    let mut first = spawn_worker(&db, dir.path(), "worker-1", 30_000, &dir.path().join("w1"));
    worker_id_of(&pool, &first).await;

    let (quick_task, quick_run) = start_task(&client, "sleep 0.3").await;
    let (task_id, run_id) = start_task(&client, "sleep 600").await;
    client
        .wait_status(&task_id, &run_id, RunStatus::Running, LONG)
        .await;
    client
        .wait_status(&quick_task, &quick_run, RunStatus::Running, LONG)
        .await;

    let status = first.terminate(Duration::from_secs(20));
    assert!(status.success(), "the worker exited with {status}");
    // The short run finished within the drain window; the long one was handed back.
    assert_eq!(
        client.run(&quick_task, &quick_run).await.status,
        RunStatus::Completed
    );
    let run = client.run(&task_id, &run_id).await;
    assert_eq!(run.status, RunStatus::Queued);
    let events = client.events(&task_id, &run_id).await;
    let gap = events
        .iter()
        .find(|e| e.event_type == EventType::GapRunDisconnected)
        .unwrap();
    assert_eq!(gap.data["reason"], "worker_shutdown");
    let (owner, attempts): (Option<String>, i32) =
        sqlx::query_as("SELECT lease_owner, attempts FROM queue_jobs WHERE ref_id = $1")
            .bind(&run_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (owner, attempts),
        (None, 0),
        "released at once, without penalty"
    );
    let workers: i64 = sqlx::query_scalar("SELECT count(*) FROM workers")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(workers, 0, "the worker deregistered");

    // Another worker takes it straight away (no lease to wait out).
    let _second = spawn_worker(&db, dir.path(), "worker-2", 30_000, &dir.path().join("w2"));
    client
        .wait_status(
            &task_id,
            &run_id,
            RunStatus::Running,
            Duration::from_secs(20),
        )
        .await;
    client.api.cancel_run(&task_id, &run_id).await.unwrap();
}

/// The compose stack's topology with real processes: one `keel migrate` on an empty
/// database, two `keel api`, four `keel worker`; a worker leaves and another joins while
/// work is running.
#[tokio::test]
async fn migrate_two_apis_and_four_workers_share_the_work() {
    const RUNS: usize = 40;
    let db = support::empty_database().await;
    let (migrated, output) = support::run_keel(&db, &["migrate"]);
    assert!(migrated, "keel migrate failed: {output}");
    let pool = support::pool(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let apis = [
        spawn_api(&db, dir.path(), "api-1").await,
        spawn_api(&db, dir.path(), "api-2").await,
    ];
    let clients: Vec<Client> = apis.iter().map(|a| a.client.clone().unwrap()).collect();
    let mut workers: Vec<KeelProcess> = (1..=4)
        .map(|i| {
            spawn_worker(
                &db,
                dir.path(),
                &format!("worker-{i}"),
                5_000,
                &dir.path().join(format!("w{i}")),
            )
        })
        .collect();
    wait_for(
        Duration::from_secs(30),
        "four live workers on both APIs",
        || async {
            let mut live = Vec::new();
            for client in &clients {
                let stats = client.api.system_stats().await;
                live.push(stats.map_or(0, |s| s.data.workers.live));
            }
            (live == [4, 4]).then_some(())
        },
    )
    .await;

    let mut runs = Vec::new();
    for i in 0..RUNS {
        runs.push(start_task(&clients[i % 2], "sleep 0.3").await);
    }
    // A worker leaves (SIGTERM: it drains) and a new one joins, mid-work.
    let status = workers.remove(0).terminate(Duration::from_secs(30));
    assert!(status.success(), "the leaving worker exited with {status}");
    workers.push(spawn_worker(
        &db,
        dir.path(),
        "worker-5",
        5_000,
        &dir.path().join("w5"),
    ));

    for (i, (task_id, run_id)) in runs.iter().enumerate() {
        let run = clients[(i + 1) % 2]
            .wait_terminal(task_id, run_id, LONG)
            .await;
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    }
    let workers_used: i64 = sqlx::query_scalar("SELECT count(DISTINCT worker_id) FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        workers_used >= 2,
        "the work was spread over workers ({workers_used})"
    );
    let finished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM run_events WHERE type = 'run.finished'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(finished, RUNS as i64);
}
