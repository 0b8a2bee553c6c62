//! Partitions, with real `keel` processes: a worker cut off from PostgreSQL by a frozen
//! proxy (its connections hang, nothing is refused) stops its own runs at its lease's local
//! deadline, before the other worker takes them over, so no run has processes on two
//! workers at once; after the heal each run has one outcome and the cut-off worker claims
//! again. Bad lease timings are refused at start-up. The figures (freeze to local kill,
//! takeover, recovery) are printed, not asserted.

use crate::support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::proxy::DelayProxy;
use crate::support::{Client, spawn_api, spawn_worker, wait_for, worker_id_of};
use keel_client::{EventType, RunStatus};
use serde_json::json;

const LEASE_MS: u64 = 3_000;
const RUNS: usize = 4;
const LONG: Duration = Duration::from_secs(120);

/// Which runs have live processes under a worker's data directory: a run's processes carry
/// `HOME=<data dir>/workspaces/<run id>/.keel/home` (their pids are their PID namespace's).
fn runs_with_processes(data_dir: &Path) -> Vec<String> {
    let prefix = format!("HOME={}/", data_dir.join("workspaces").display());
    let mut runs = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
            .is_none()
        {
            continue;
        }
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        for variable in environ.split(|b| *b == 0) {
            let Some(rest) = std::str::from_utf8(variable)
                .ok()
                .and_then(|v| v.strip_prefix(&prefix))
            else {
                continue;
            };
            if let Some(run) = rest.split('/').next() {
                runs.push(run.to_string());
            }
        }
    }
    runs
}

/// What the process watch saw, per run: when the cut-off worker's processes were last
/// seen, when the other worker's were first seen, and the longest stretch both had some.
#[derive(Default, Debug)]
struct Seen {
    cut_last: Option<Instant>,
    other_first: Option<Instant>,
    both_since: Option<Instant>,
    longest_overlap: Duration,
}

/// Samples both workers' run processes every few milliseconds until `stop`.
fn watch_processes(
    cut: PathBuf,
    other: PathBuf,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> (
    Arc<Mutex<HashMap<String, Seen>>>,
    std::thread::JoinHandle<()>,
) {
    let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
    let record = seen.clone();
    let handle = std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let now = Instant::now();
            let (on_cut, on_other) = (runs_with_processes(&cut), runs_with_processes(&other));
            let mut seen = record.lock().unwrap();
            for run in on_cut.iter().chain(&on_other) {
                seen.entry(run.clone()).or_default();
            }
            for (run, entry) in seen.iter_mut() {
                let (a, b) = (on_cut.contains(run), on_other.contains(run));
                if a {
                    entry.cut_last = Some(now);
                }
                if b && entry.other_first.is_none() {
                    entry.other_first = Some(now);
                }
                match (a && b, entry.both_since) {
                    (true, None) => entry.both_since = Some(now),
                    (true, Some(since)) => {
                        entry.longest_overlap = entry.longest_overlap.max(now - since)
                    }
                    (false, _) => entry.both_since = None,
                }
                // A single sample with both counts as overlap too.
                if a && b && entry.longest_overlap.is_zero() {
                    entry.longest_overlap = Duration::from_nanos(1);
                }
            }
            drop(seen);
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    (seen, handle)
}

/// The longest overlap, and the latest times from the freeze to a run's last process on
/// the cut-off worker and to its first on the other; asserts that each run's processes
/// left the cut-off worker before they started on the other.
fn figures(
    seen: &HashMap<String, Seen>,
    runs: &[(String, String)],
    frozen: Instant,
) -> (Duration, Duration, Duration) {
    let (mut longest_overlap, mut kill, mut takeover) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for (_, run_id) in runs {
        let entry = seen.get(run_id).expect("the watch saw the run");
        longest_overlap = longest_overlap.max(entry.longest_overlap);
        let last = entry
            .cut_last
            .expect("the cut-off worker's processes were seen");
        let first = entry
            .other_first
            .expect("the other worker's processes were seen");
        assert!(
            last < first,
            "{run_id}: the cut-off worker still ran it after the takeover"
        );
        kill = kill.max(last.saturating_duration_since(frozen));
        takeover = takeover.max(first.saturating_duration_since(frozen));
    }
    (longest_overlap, kill, takeover)
}

async fn start_shell_run(client: &Client, command: &str) -> (String, String) {
    client.start_task(&support::shell(command)).await
}

#[tokio::test]
async fn a_cut_off_worker_kills_its_runs_before_another_takes_them_over() {
    let db = support::fresh_database().await;
    let pool = support::pool(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let api = spawn_api(&db, dir.path(), "api").await;
    let client = api.client.clone().unwrap();
    let proxy = DelayProxy::freezable(&db).await;
    let (cut_data, other_data) = (dir.path().join("cut"), dir.path().join("other"));
    let cut = spawn_worker(&proxy.url, dir.path(), "cut", LEASE_MS, &cut_data);
    let cut_id = worker_id_of(&pool, &cut).await;

    let mut runs = Vec::new();
    for _ in 0..RUNS {
        runs.push(start_shell_run(&client, "sleep 8; echo done").await);
    }
    for (task_id, run_id) in &runs {
        client
            .wait_status(task_id, run_id, RunStatus::Running, LONG)
            .await;
    }
    wait_for(
        LONG,
        "every run's processes on the cut-off worker",
        || async { (runs_with_processes(&cut_data).len() >= RUNS).then_some(()) },
    )
    .await;
    let other = spawn_worker(&db, dir.path(), "other", LEASE_MS, &other_data);
    let other_id = worker_id_of(&pool, &other).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (seen, watcher) = watch_processes(cut_data.clone(), other_data.clone(), stop.clone());

    let frozen = Instant::now();
    proxy.freeze();
    for (task_id, run_id) in &runs {
        let run = client.wait_terminal(task_id, run_id, LONG).await;
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
        assert_eq!(run.worker_id.as_ref(), Some(&other_id), "{run:?}");
    }
    // The cut-off worker stopped each run on its own, still partitioned.
    assert!(runs_with_processes(&cut_data).is_empty());
    let thawed = Instant::now();
    proxy.thaw();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    watcher.join().unwrap();

    let (longest_overlap, kill, takeover) = figures(&seen.lock().unwrap(), &runs, frozen);
    assert_eq!(
        longest_overlap,
        Duration::ZERO,
        "processes of one run on two workers"
    );

    // Healed: the cut-off worker claims again, on connections that recovered by themselves.
    let mut other = other;
    other.terminate(LONG);
    let (task_id, run_id) = start_shell_run(&client, "echo again").await;
    let again = client.wait_terminal(&task_id, &run_id, LONG).await;
    let recovered = thawed.elapsed();
    assert_eq!(again.status, RunStatus::Completed, "{again:?}");
    assert_eq!(again.worker_id.as_ref(), Some(&cut_id), "{again:?}");
    // And wrote nothing into the runs it lost: each has one outcome.
    for (task_id, run_id) in &runs {
        let events = client.events(task_id, run_id).await;
        let finished = events
            .iter()
            .filter(|e| e.event_type == EventType::RunFinished)
            .count();
        assert_eq!(finished, 1, "{run_id}: {events:?}");
        let run = client.run(task_id, run_id).await;
        assert_eq!(run.worker_id.as_ref(), Some(&other_id), "{run:?}");
    }
    let log = std::fs::read_to_string(&cut.log).unwrap();
    assert!(log.contains("lease lost locally"), "{log}");
    eprintln!(
        "partition figures (lease {LEASE_MS} ms, {RUNS} shell runs): longest overlap {longest_overlap:?}, \
         freeze to last local process {kill:?}, freeze to first takeover process {takeover:?}, \
         heal to a new run completed on the healed worker {recovered:?}"
    );
}

#[test]
fn lease_timings_that_could_overlap_are_refused_at_start_up() {
    let url = "postgres://nobody@127.0.0.1:1/none";
    let (ok, output) = support::run_keel(
        url,
        &[
            "worker",
            "--lease-ms",
            "3000",
            "--heartbeat-timeout-ms",
            "1500",
        ],
    );
    assert!(!ok);
    assert!(output.contains("three heartbeat timeouts"), "{output}");
    let (ok, output) = support::run_keel(
        url,
        &["worker", "--lease-ms", "3000", "--lease-margin-ms", "3000"],
    );
    assert!(!ok);
    assert!(output.contains("less than the lease"), "{output}");
}

/// The API in front of a frozen database: every request answers 503 with the envelope and
/// a Retry-After within the API's bound (the client here gives up far later), `/readyz`
/// says the database is unreachable, and once thawed the API serves again by itself.
#[tokio::test]
async fn an_api_cut_off_from_its_database_answers_503_then_recovers() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = DelayProxy::freezable(&db).await;
    let api = spawn_api(&proxy.url, dir.path(), "api").await;
    let client = api.client.clone().unwrap();
    let base = client.base.clone();
    let (status, _) = client.get("/v1/tasks").await;
    assert_eq!(status, reqwest::StatusCode::OK);

    proxy.freeze();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap();
    let asked = Instant::now();
    let (tasks, ready) = tokio::join!(
        http.get(format!("{base}/v1/tasks")).send(),
        http.get(format!("{base}/readyz")).send(),
    );
    let answered = asked.elapsed();
    let tasks = tasks.expect("an answer, not a hang");
    assert_eq!(tasks.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(tasks.headers()["retry-after"], "5");
    let body: serde_json::Value = tasks.json().await.unwrap();
    assert_eq!(body["error"]["type"], "unavailable", "{body}");
    assert!(body["error"]["request_id"].is_string(), "{body}");
    let ready = ready.expect("an answer, not a hang");
    assert_eq!(ready.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let ready: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(ready["database"], "unreachable", "{ready}");

    let thawed = Instant::now();
    proxy.thaw();
    wait_for(LONG, "the API to serve again", || async {
        (client.get("/v1/tasks").await.0 == reqwest::StatusCode::OK).then_some(())
    })
    .await;
    eprintln!(
        "API figures: frozen database answered 503 after {answered:?}; serving again {:?} after the thaw",
        thawed.elapsed()
    );
}

/// An API whose every connection is busy (one, held by a request that waits on a lock)
/// says so, with a short Retry-After, instead of calling the database unavailable; the
/// held request answers once the lock goes.
#[tokio::test]
async fn a_saturated_pool_answers_busy_not_unavailable() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let env = [("KEEL_DB_MAX_CONNECTIONS", "1")];
    let api = support::spawn_api_with_env(&db, dir.path(), "api", &env).await;
    let client = api.client.clone().unwrap();
    assert_eq!(client.get("/v1/tasks").await.0, reqwest::StatusCode::OK);

    let pool = support::pool(&db).await;
    // A connection of its own: the pool's would end an idle transaction after seconds.
    let mut holder = <sqlx::PgConnection as sqlx::Connection>::connect(&db)
        .await
        .unwrap();
    let mut lock = sqlx::Connection::begin(&mut holder).await.unwrap();
    sqlx::query("LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let held = tokio::spawn({
        let client = client.clone();
        async move { client.get("/v1/tasks").await.0 }
    });
    wait_for(LONG, "the API's one connection to wait on the lock", || {
        let pool = pool.clone();
        async move {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name = 'keel-api' AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (waiting == 1).then_some(())
        }
    })
    .await;

    let busy = client.http.get(format!("{}/v1/tasks", client.base));
    let busy = busy.send().await.unwrap();
    assert_eq!(busy.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(busy.headers()["retry-after"], "1");
    let body: serde_json::Value = busy.json().await.unwrap();
    assert_eq!(body["error"]["type"], "unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("connection") && message.contains("in use"),
        "{body}"
    );
    assert!(body["error"]["request_id"].is_string(), "{body}");

    lock.commit().await.unwrap();
    assert_eq!(held.await.unwrap(), reqwest::StatusCode::OK);
}

const LLM_KEY: &str = "sk-partition-test";

/// A worker's settings for agent loops on the fake model server.
fn agent_worker_env() -> [(&'static str, &'static str); 3] {
    [
        ("KEEL_APPROVAL_POLICIES", "none"),
        ("FAKE_LLM_API_KEY", LLM_KEY),
        ("KEEL_CHAT_ALLOW_PRIVATE_ADDRESSES", "true"),
    ]
}

/// An agent loop cut off mid-call: the worker's proxy freezes while its second model call
/// is in flight. No model request starts after the freeze while only the cut-off worker
/// runs, past its local deadline (freeze + lease − margin bounds it from above); the other
/// worker repeats only the call that was in flight, and the run ends once.
#[tokio::test]
async fn a_cut_off_agent_loop_starts_no_model_call_after_its_deadline() {
    let held = tokio_util::sync::CancellationToken::new();
    let llm = support::llm::FakeLlm::start(vec![
        support::llm::Turn::tool_call("c1", "list_dir", "{}"),
        support::llm::Turn::text("in flight at the freeze").hold(held.clone()),
        support::llm::Turn::text("answered after the takeover"),
    ])
    .await
    .require_key(LLM_KEY);
    let db = support::fresh_database().await;
    let pool = support::pool(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let api = spawn_api(&db, dir.path(), "api").await;
    let client = api.client.clone().unwrap();
    let (status, preset) = client
        .post(
            "/v1/providers",
            json!({ "kind": "openai-compatible", "model": "fake-model", "api": "openai-completions",
                    "base_url": llm.openai_base(), "api_key_ref": "env:FAKE_LLM_API_KEY",
                    "capabilities": ["chat", "tool_call"], "enabled": true }),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{preset}");
    let proxy = DelayProxy::freezable(&db).await;
    let env = agent_worker_env();
    let cut_data = dir.path().join("cut");
    let cut =
        support::spawn_worker_with_env(&proxy.url, dir.path(), "cut", LEASE_MS, &cut_data, &env);
    let cut_id = worker_id_of(&pool, &cut).await;
    let (task_id, run_id) = client
        .start_task(&support::agent_loop("Tidy the notes."))
        .await;
    llm.wait_for_requests(2, LONG).await;

    let frozen = Instant::now();
    proxy.freeze();
    // Past the cut-off worker's deadline (at most freeze + lease − margin), and then some:
    // it started nothing more, alone with the run.
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 500)).await;
    let after_deadline = llm.requests().len();
    let log = std::fs::read_to_string(&cut.log).unwrap();
    assert!(log.contains("lease lost locally"), "{log}");
    let other_data = dir.path().join("other");
    let other =
        support::spawn_worker_with_env(&db, dir.path(), "other", LEASE_MS, &other_data, &env);
    let other_id = worker_id_of(&pool, &other).await;
    let run = client.wait_terminal(&task_id, &run_id, LONG).await;
    let taken_over = frozen.elapsed();
    held.cancel();
    proxy.thaw();

    assert_eq!(after_deadline, 2, "a model call started after the deadline");
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.worker_id.as_ref(), Some(&other_id), "{run:?}");
    assert_eq!(run.model_call_count, 2, "{run:?}");
    // The call in flight at the freeze is the one the other worker found abandoned.
    assert_eq!(run.abandoned_model_calls, 1, "{run:?}");
    let requests = llm.requests().len();
    // Call 1 once, call 2 twice: the one in flight at the freeze, and its repeat.
    assert_eq!(
        requests, 3,
        "model calls beyond the one in flight were repeated"
    );
    assert_eq!(llm.completed(), 2);
    let events = client.events(&task_id, &run_id).await;
    let finished = events
        .iter()
        .filter(|e| e.event_type == EventType::RunFinished)
        .count();
    assert_eq!(finished, 1, "{events:?}");
    let abandoned: Vec<_> = events
        .iter()
        .filter(|e| e.event_type == EventType::ModelCallAbandoned)
        .map(|e| e.data["index"].clone())
        .collect();
    assert_eq!(abandoned, [json!(2)], "{events:?}");
    assert_ne!(cut_id, other_id);
    eprintln!(
        "agent-loop partition figures (lease {LEASE_MS} ms): model requests {requests} for 2 calls \
         (repeated: {}), none after the cut-off worker's deadline; freeze to the run completed \
         on the other worker {taken_over:?}",
        requests - 2
    );
}

/// A worker started while its database refuses connections (PostgreSQL starting beside
/// it, a failover under way) waits for it instead of exiting, and runs work once it
/// answers.
#[tokio::test]
async fn a_worker_started_before_its_database_answers_waits_for_it() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let api = spawn_api(&db, dir.path(), "api").await;
    let client = api.client.clone().unwrap();
    let proxy = DelayProxy::freezable(&db).await;
    let refusing = format!("postgres://keel@127.0.0.1:{}/keel", support::free_port());
    proxy.retarget(&refusing);
    let mut worker = spawn_worker(
        &proxy.url,
        dir.path(),
        "worker",
        LEASE_MS,
        &dir.path().join("data"),
    );
    wait_for(LONG, "the worker to try again", || async {
        let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
        log.contains("the database cannot be reached; trying again")
            .then_some(())
    })
    .await;
    let (task_id, run_id) = client.run_shell("echo reached").await;

    proxy.retarget(&db);
    let run = client
        .wait_status(&task_id, &run_id, RunStatus::Completed, LONG)
        .await;
    assert_eq!(run.status, RunStatus::Completed);
    assert!(
        worker.child.try_wait().unwrap().is_none(),
        "the worker is still running"
    );
}
