//! The runs figure: the full product path. Real `keel api` and `keel worker` processes;
//! N shell tasks of `true` created and started over HTTP (`POST /v1/tasks`, then
//! `POST …/start`), their `run.started` and `run.finished` read from the public event
//! stream (`GET /v1/events/stream`), all on the bench's clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::watch;

use super::children::{self, Process};
use super::stats::Latency;
use super::{POLL, RunArgs};

#[derive(Debug, Serialize, Deserialize)]
pub struct RunsFigures {
    pub runs: usize,
    pub workers: usize,
    pub concurrency: usize,
    pub seconds: f64,
    pub runs_per_s: f64,
    /// Runs that ended other than `completed` (expected: none).
    pub failed: usize,
    /// Start request sent → `run.started` received.
    pub started: Latency,
    /// Start request sent → `run.finished` received.
    pub finished: Latency,
}

/// What the event stream delivered, per task: (event type, arrival).
type Arrivals = Arc<Mutex<HashMap<String, Vec<(String, Instant)>>>>;

pub async fn figures(pool: &PgPool, url: &str, args: &RunArgs) -> anyhow::Result<RunsFigures> {
    let data_dir = std::env::temp_dir().join(format!("keel-bench-{}", std::process::id()));
    let result = measure(pool, url, args, &data_dir).await;
    let _ = std::fs::remove_dir_all(&data_dir);
    result
}

async fn measure(
    pool: &PgPool,
    url: &str,
    args: &RunArgs,
    data_dir: &std::path::Path,
) -> anyhow::Result<RunsFigures> {
    let base = format!("http://127.0.0.1:{}", free_port()?);
    let no_approvals = [("KEEL_APPROVAL_POLICIES", "none")];
    let api = Process::keel(
        url,
        &[
            "api".into(),
            "--listen".into(),
            base.trim_start_matches("http://").into(),
        ],
        &no_approvals,
    )?;
    let dir = data_dir.to_string_lossy();
    let workers = (0..args.run_workers)
        .map(|_| {
            let flags = [
                "worker".into(),
                format!("--concurrency={}", args.concurrency),
            ];
            Process::keel(url, &flags, &[no_approvals[0], ("KEEL_DATA_DIR", &dir)])
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pids: Vec<i32> = workers.iter().map(Process::pid).collect();
    children::wait_registered(pool, &pids).await?;
    let http = reqwest::Client::new();
    wait_healthy(&http, &base).await?;

    let arrivals = Arrivals::default();
    let (ended_tx, mut ended) = watch::channel(0usize);
    // The feed from its newest event on (nothing else writes while the figure is set up).
    let after: String = sqlx::query_scalar(
        "SELECT COALESCE((SELECT feed_xid::text || '-' || id FROM run_events
                          ORDER BY feed_xid DESC, id DESC LIMIT 1), '0-0')",
    )
    .fetch_one(pool)
    .await?;
    let reader = tokio::spawn(read_stream(
        http.clone(),
        format!(
            "{base}/v1/events/stream?event_type=run.started,run.finished,run.failed&after={after}"
        ),
        arrivals.clone(),
        ended_tx,
    ));

    let first = Instant::now();
    let requested: HashMap<String, Instant> = futures_util::stream::iter(0..args.runs)
        .map(|_| start_run(&http, &base))
        .buffer_unordered(args.concurrency.max(1))
        .try_collect()
        .await?;
    ended.wait_for(|n| *n >= args.runs).await?;
    reader.abort();
    drop((api, workers));
    summarize(args, first, &requested, &arrivals.lock().unwrap())
}

fn summarize(
    args: &RunArgs,
    first: Instant,
    requested: &HashMap<String, Instant>,
    arrivals: &HashMap<String, Vec<(String, Instant)>>,
) -> anyhow::Result<RunsFigures> {
    let mut started = Vec::new();
    let mut finished = Vec::new();
    let mut failed = 0;
    let mut last = first;
    for (task_id, sent) in requested {
        for (event, at) in arrivals.get(task_id).into_iter().flatten() {
            match event.as_str() {
                "run.started" => started.push(*at - *sent),
                "run.finished" => finished.push(*at - *sent),
                _ => failed += 1,
            }
            last = last.max(*at);
        }
    }
    let seconds = (last - first).as_secs_f64();
    let none = || anyhow::anyhow!("the event stream delivered no run event");
    Ok(RunsFigures {
        runs: args.runs,
        workers: args.run_workers,
        concurrency: args.concurrency,
        seconds,
        runs_per_s: args.runs as f64 / seconds,
        failed,
        started: Latency::of(&started).ok_or_else(none)?,
        finished: Latency::of(&finished).ok_or_else(none)?,
    })
}

/// Creates a shell task of `true` and starts it; returns its id and when the start
/// request was sent.
async fn start_run(http: &reqwest::Client, base: &str) -> anyhow::Result<(String, Instant)> {
    let task: Value = http
        .post(format!("{base}/v1/tasks"))
        .json(&json!({ "execution_kind": "shell", "shell_command": "true" }))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let task_id = task["data"]["id"]
        .as_str()
        .context("task response without an id")?
        .to_string();
    let sent = Instant::now();
    http.post(format!("{base}/v1/tasks/{task_id}/start"))
        .send()
        .await?
        .error_for_status()?;
    Ok((task_id, sent))
}

/// Reads the feed's SSE frames, recording each run event's arrival; counts terminal ones.
async fn read_stream(
    http: reqwest::Client,
    url: String,
    arrivals: Arrivals,
    ended: watch::Sender<usize>,
) -> anyhow::Result<()> {
    let mut body = http
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .bytes_stream();
    let mut buffer = String::new();
    while let Some(chunk) = body.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            let Some(event) = frame_data(&frame) else {
                continue;
            };
            let (Some(task_id), Some(kind)) = (event["task_id"].as_str(), event["type"].as_str())
            else {
                continue;
            };
            let at = Instant::now();
            let mut arrivals = arrivals.lock().unwrap();
            arrivals
                .entry(task_id.to_string())
                .or_default()
                .push((kind.to_string(), at));
            if kind != "run.started" {
                ended.send_modify(|n| *n += 1);
            }
        }
    }
    Ok(())
}

/// The JSON of an SSE frame's `data:` lines.
fn frame_data(frame: &str) -> Option<Value> {
    let data: String = frame
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim_start)
        .collect();
    serde_json::from_str(&data).ok()
}

async fn wait_healthy(http: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http
        .get(format!("{base}/healthz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "keel api did not answer within 30 s"
        );
        tokio::time::sleep(POLL * 10).await;
    }
    Ok(())
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    #[test]
    fn frame_data_joins_data_lines() {
        let frame = "id: 3\nevent: run.started\ndata: {\"task_id\":\"t\",\ndata: \"type\":\"run.started\"}\n\n";
        let data = super::frame_data(frame).unwrap();
        assert_eq!(data["task_id"], "t");
        assert_eq!(data["type"], "run.started");
    }
}
