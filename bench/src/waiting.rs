//! The waiting figure: runs that wait rather than compute (`sleep 0.5`), so adding
//! workers adds slots without adding much CPU. Real `keel api` and `keel worker`
//! processes as in the runs figure, each worker with `--waiting-slots` slots, the runs
//! started over HTTP and their ends read from the event stream. Measured once per worker
//! count (`--run-workers`); the scaling efficiency of a point is its throughput over the
//! first point's scaled linearly by the worker count (1.0: every worker added its full
//! share). A 2-core machine can show this figure where the runs figure cannot: the
//! runs' time is spent asleep, not on its cores.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::RunArgs;
use super::children;
use super::runs::{Deployment, summarize};

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
    /// Runs/s while the slots are full: the middle 80 % of the runs' ends (from the 10th
    /// to the 90th percentile), without the admission's ramp-up and the last round's tail.
    pub steady_runs_per_s: f64,
    /// `steady_runs_per_s` over the first point's, scaled by the worker count.
    pub steady_scaling_efficiency: f64,
}

pub async fn figures(pool: &PgPool, url: &str, args: &RunArgs) -> anyhow::Result<WaitingFigures> {
    children::in_data_dir("keel-bench", |data_dir| async move {
        let mut points: Vec<WaitingPoint> = Vec::new();
        for &workers in &args.run_workers {
            let (seconds, failed, steady_runs_per_s) =
                point(pool, url, args, &data_dir, workers).await?;
            let runs_per_s = args.waiting_runs as f64 / seconds;
            // What the first point's rate would be at this worker count, if linear.
            let linear = |rate: fn(&WaitingPoint) -> f64, own: f64| {
                points.first().map_or(own, |first: &WaitingPoint| {
                    rate(first) * workers as f64 / first.workers as f64
                })
            };
            let scaling_efficiency = runs_per_s / linear(|p| p.runs_per_s, runs_per_s);
            let steady_scaling_efficiency =
                steady_runs_per_s / linear(|p| p.steady_runs_per_s, steady_runs_per_s);
            eprintln!(
                "keel-bench: waiting runs, {workers} workers: {runs_per_s:.1} runs/s, steady {steady_runs_per_s:.1}"
            );
            points.push(WaitingPoint {
                workers,
                seconds,
                runs_per_s,
                failed,
                slots_runs_per_s: (workers * args.waiting_slots) as f64 / args.waiting_secs,
                scaling_efficiency,
                steady_runs_per_s,
                steady_scaling_efficiency,
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

/// One worker count on fresh processes: seconds from the first start to the last end, the
/// runs that failed, and the steady rate.
async fn point(
    pool: &PgPool,
    url: &str,
    args: &RunArgs,
    data_dir: &std::path::Path,
    workers: usize,
) -> anyhow::Result<(f64, usize, f64)> {
    let deployment =
        Deployment::start(pool, url, data_dir, workers, args.waiting_slots, &[]).await?;
    let command = format!("sleep {}", args.waiting_secs);
    let first = Instant::now();
    let requested = deployment
        .run_all(args.waiting_runs, &command, args.concurrency)
        .await?;
    let arrivals = deployment.arrivals.clone();
    deployment.stop(pool).await?;
    let arrivals = arrivals.lock().unwrap();
    let (seconds, failed, _, _) = summarize(first, &requested, &arrivals)?;
    let mut ends: Vec<Instant> = arrivals
        .values()
        .flatten()
        .filter(|(event, _)| event != "run.started")
        .map(|(_, at)| *at)
        .collect();
    Ok((seconds, failed, steady_rate(&mut ends)))
}

/// Ends per second between the 10th and the 90th percentile of `ends`.
fn steady_rate(ends: &mut [Instant]) -> f64 {
    ends.sort_unstable();
    let (low, high) = (ends.len() / 10, ends.len() * 9 / 10);
    match (ends.get(low), ends.get(high)) {
        (Some(first), Some(last)) if high > low => {
            (high - low) as f64 / last.duration_since(*first).as_secs_f64().max(f64::EPSILON)
        }
        _ => f64::NAN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_steady_rate_leaves_out_the_first_and_last_tenth() {
        let start = Instant::now();
        // 100 ends: the first ten and the last nine far apart, the middle 1 ms apart.
        let mut ends: Vec<Instant> = (0..100)
            .map(|i| match i {
                0..10 => start + Duration::from_secs(i),
                10..=90 => start + Duration::from_secs(10) + Duration::from_millis(i - 10),
                _ => start + Duration::from_secs(100 + i),
            })
            .collect();
        ends.reverse();
        // The 10th to the 90th end: 80 ends in 80 ms.
        let rate = steady_rate(&mut ends);
        assert!((rate - 1000.0).abs() < 1e-6, "{rate}");
        assert!(steady_rate(&mut []).is_nan());
    }
}
