//! `keel bench` at a tiny size, so the benchmark keeps compiling and working. Benchmarks
//! are not tests: this asserts no timing, only that every job was processed and that
//! every figure is present (docs/benchmarks.md has the real measurements).

mod support;

use std::process::Command;

use serde_json::Value;

const JOBS: u64 = 200;
const RUNS: u64 = 20;

#[tokio::test(flavor = "multi_thread")]
async fn every_figure_is_measured_and_every_job_processed() {
    let url = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("keel.json");
    let status = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["bench", "run", "--database-url", &url, "--out"])
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
        .env("RUST_LOG", "warn,sqlx=error")
        .status()
        .expect("keel bench started");
    assert!(status.success(), "keel bench run failed: {status}");
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

    // Every job was processed: none is left in the queue, every run completed.
    let pool = support::pool(&url).await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM queue_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "jobs left in the queue");
    let completed: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'completed'")
        .fetch_one(&pool)
        .await
        .unwrap();
    // The runs figure's runs, then its lone runs.
    let lone = report["runs"]["points"][0]["lone"]["samples"]
        .as_u64()
        .unwrap();
    assert_eq!(completed as u64, RUNS + lone);

    // The table prints every figure from the saved report.
    let table = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["bench", "report", "--keel"])
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
    ] {
        assert!(table.contains(figure), "{figure} missing from:\n{table}");
    }
}
