//! The waiting figure: runs that wait rather than compute (`sleep 0.5`), so adding
//! workers adds slots without adding much CPU. Real `keel api` and `keel worker`
//! processes as in the runs figure, each worker with `--waiting-slots` slots, the runs
//! started over HTTP and their ends read from the event stream. Measured once per worker
//! count (`--run-workers`); the scaling efficiency of a point is its throughput over the
//! first point's scaled linearly by the worker count (1.0: every worker added its full
//! share). A 2-core machine can show this figure where the runs figure cannot: the
//! runs' time is spent asleep, not on its cores.

use std::collections::HashMap;
use std::time::Instant;

use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::RunArgs;
use super::children;
use super::runs::{Deployment, start_run, summarize};

#[derive(Debug, Serialize, Deserialize)]
pub struct WaitingFigures {
    pub runs: usize,
    /// How long each run sleeps.
    pub sleep_secs: f64,
    /// Slots (`--concurrency`) per worker process.
    pub slots: usize,
    /// One per worker count, in the order asked for.
    pub points: Vec<WaitingPoint>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct WaitingPoint {
    pub workers: usize,
    /// First start request sent → last terminal event received.
    pub seconds: f64,
    pub runs_per_s: f64,
    /// Runs that ended other than `completed` (expected: none).
    pub failed: usize,
    /// What the slots allow: workers × slots ÷ sleep.
    pub slots_runs_per_s: f64,
    /// `runs_per_s` over the first point's, scaled by the worker count.
    pub scaling_efficiency: f64,
}

pub async fn figures(pool: &PgPool, url: &str, args: &RunArgs) -> anyhow::Result<WaitingFigures> {
    children::in_data_dir("keel-bench", |data_dir| async move {
        let mut points: Vec<WaitingPoint> = Vec::new();
        for &workers in &args.run_workers {
            let (seconds, failed) = point(pool, url, args, &data_dir, workers).await?;
            let runs_per_s = args.waiting_runs as f64 / seconds;
            let linear = points.first().map_or(runs_per_s, |first| {
                first.runs_per_s * workers as f64 / first.workers as f64
            });
            eprintln!("keel-bench: waiting runs, {workers} workers: {runs_per_s:.1} runs/s");
            points.push(WaitingPoint {
                workers,
                seconds,
                runs_per_s,
                failed,
                slots_runs_per_s: (workers * args.waiting_slots) as f64 / args.waiting_secs,
                scaling_efficiency: runs_per_s / linear,
            });
        }
        Ok(WaitingFigures {
            runs: args.waiting_runs,
            sleep_secs: args.waiting_secs,
            slots: args.waiting_slots,
            points,
        })
    })
    .await
}

/// One worker count on fresh processes: seconds from the first start to the last end, and
/// the runs that failed.
async fn point(
    pool: &PgPool,
    url: &str,
    args: &RunArgs,
    data_dir: &std::path::Path,
    workers: usize,
) -> anyhow::Result<(f64, usize)> {
    let deployment =
        Deployment::start(pool, url, data_dir, workers, args.waiting_slots, &[]).await?;
    let command = format!("sleep {}", args.waiting_secs);
    let first = Instant::now();
    let requested: HashMap<String, Instant> = futures_util::stream::iter(0..args.waiting_runs)
        .map(|_| start_run(&deployment.http, &deployment.base, &command))
        .buffer_unordered(args.concurrency.max(1))
        .try_collect()
        .await?;
    let mut ended = deployment.ended.clone();
    ended.wait_for(|n| *n >= args.waiting_runs).await?;
    let arrivals = deployment.arrivals.clone();
    deployment.stop(pool).await?;
    let (seconds, failed, _, _) = summarize(first, &requested, &arrivals.lock().unwrap())?;
    Ok((seconds, failed))
}
