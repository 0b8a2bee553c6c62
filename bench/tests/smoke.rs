//! `keel-bench` at a tiny size, so the benchmark keeps compiling and working. Benchmarks
//! are not tests: this asserts no timing, only that every job was processed and that
//! every figure is present (docs/benchmarks.md has the real measurements). The runs
//! figure starts the `keel` binary cargo built beside `keel-bench`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

const JOBS: u64 = 200;
const RUNS: u64 = 20;
const AGENT_RUNS: u64 = 4;
const WAITING_RUNS: u64 = 8;

#[tokio::test(flavor = "multi_thread")]
async fn every_figure_is_measured_and_every_job_processed() {
    let dir = tempfile::tempdir().unwrap();
    // Run as root, the cluster runs as the `postgres` user: it must reach the directory.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let (_cluster, url) = throwaway_cluster(dir.path());
    let out = dir.path().join("keel.json");
    let status = Command::new(env!("CARGO_BIN_EXE_keel-bench"))
        .args(["run", "--database-url", &url, "--out"])
        .arg(&out)
        .args([
            "--jobs",
            &JOBS.to_string(),
            "--concurrency",
            "8",
            "--samples",
            "20",
        ])
        .args(["--runs", &RUNS.to_string(), "--run-workers", "2"])
        .args([
            "--scaling-processes",
            "1,2",
            "--scaling-concurrency",
            "4,32",
        ])
        .args(["--recovery-jobs", "4", "--recovery-lease-ms", "1000"])
        .args(["--history-rows", "1000", "--snapshot-rate", "100"])
        .args(["--snapshot-before-secs", "1", "--hold-secs", "1"])
        .args(["--snapshot-after-secs", "1"])
        .args([
            "--agent-runs",
            &AGENT_RUNS.to_string(),
            "--agent-calls",
            "3",
        ])
        .args(["--waiting-runs", &WAITING_RUNS.to_string()])
        .args(["--waiting-secs", "0.1", "--waiting-slots", "2"])
        .args(["--api-history-tasks", "440", "--api-history-samples", "5"])
        .env("RUST_LOG", "warn,sqlx=error")
        .status()
        .expect("keel-bench started");
    assert!(status.success(), "keel-bench run failed: {status}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();

    assert_eq!(report["queue"]["throughput"]["jobs"], JOBS);
    assert_eq!(report["queue"]["latency"]["samples"], 20);
    assert_eq!(report["runs"]["runs"], RUNS);
    let runs = &report["runs"]["points"][0];
    assert_eq!(runs["workers"], 2);
    assert_eq!(runs["failed"], 0);
    assert_eq!(runs["finished"]["samples"], RUNS);
    assert!(runs["transactions_per_run"].is_number());
    assert_eq!(report["scaling"].as_array().unwrap().len(), 4);
    assert_eq!(report["recovery"]["jobs"], 4);
    assert_eq!(report["history"]["full"]["jobs"], JOBS);
    for phase in ["before", "during", "after"] {
        assert!(
            report["snapshot"][phase]["jobs_per_s"].is_number(),
            "{phase}"
        );
    }
    assert!(report["snapshot"]["dead_tuples"]["baseline"].is_number());
    let series = report["snapshot"]["pickup_series"].as_array().unwrap();
    assert!(
        series.iter().any(|step| step[1].as_u64() > Some(0)),
        "the pickup series counts the jobs started: {series:?}"
    );

    let agent = &report["agent"];
    assert_eq!(agent["failed"], 0, "{agent}");
    // Three calls a run: two gaps between an answer and the next call.
    assert_eq!(agent["overhead"]["samples"], AGENT_RUNS * 2, "{agent}");

    let waiting = &report["waiting"];
    assert_eq!(waiting["runs"], WAITING_RUNS, "{waiting}");
    let point = &waiting["points"][0];
    assert_eq!(point["workers"], 2, "{waiting}");
    assert_eq!(point["failed"], 0, "{waiting}");
    // 2 workers × 2 slots ÷ 0.1 s.
    assert_eq!(point["slots_runs_per_s"], 40.0, "{waiting}");
    // Eight runs of 0.1 s through four slots take at least two rounds.
    assert!(point["seconds"].as_f64().unwrap() >= 0.2, "{waiting}");

    // Its own database: 440 tasks (2 runs, 20 events each), and the 5 admissions of each
    // measurement (`run.created`, `task.updated`, `run.queued`).
    let history = &report["api_history"];
    // The loaded database: its history and the five admissions timed on it.
    assert_eq!(history["tasks"], 440 + 5, "{history}");
    assert_eq!(history["events"], 440 * 20 + 5 * 3, "{history}");
    for state in ["empty", "loaded"] {
        assert_eq!(history[state]["sse_first_byte"]["samples"], 5, "{history}");
    }

    // Every job was processed: none is left in the queue, every run completed.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM queue_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "jobs left in the queue");
    let completed: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'completed'")
        .fetch_one(&pool)
        .await
        .unwrap();
    // The runs figure's runs, then its lone runs, the agent figure's and the waiting ones.
    let lone = report["runs"]["points"][0]["lone"]["samples"]
        .as_u64()
        .unwrap();
    assert_eq!(completed as u64, RUNS + lone + AGENT_RUNS + WAITING_RUNS);

    // The table prints every figure from the saved report.
    let table = Command::new(env!("CARGO_BIN_EXE_keel-bench"))
        .args(["report", "--keel"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(table.status.success());
    let table = String::from_utf8(table.stdout).unwrap();
    for figure in [
        "queue throughput",
        "runs: runs/s",
        "scaling:",
        "recovery:",
        "history:",
        "snapshot:",
        "waiting runs:",
        "api history:",
    ] {
        assert!(table.contains(figure), "{figure} missing from:\n{table}");
    }
}

/// `keel-bench postgres` under `dir`: a throwaway cluster for this test alone, stopped
/// (SIGTERM) when the guard drops; returns it and the URL of its `bench` database.
fn throwaway_cluster(dir: &std::path::Path) -> (Cluster, String) {
    let root = dir.join("postgres");
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel-bench"))
        .arg("postgres")
        .arg(&root)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("keel-bench postgres started");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("the cluster's URL");
    assert!(line.starts_with("postgres"), "no cluster URL: {line:?}");
    (Cluster(child), line.trim().to_string())
}

struct Cluster(Child);

impl Drop for Cluster {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}
