//! The recovery figure: a worker holding K leased jobs is killed with SIGKILL; the clock
//! runs until every one of them is leased by (and so started on) the surviving worker.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::children;
use super::noop::{HOLD_PREFIX, KIND};
use super::queue::{clear, enqueue_bulk};
use super::{POLL, RunArgs};

#[derive(Debug, Serialize, Deserialize)]
pub struct RecoveryFigures {
    pub jobs: usize,
    pub lease_s: f64,
    /// Kill → all K jobs leased by the other worker.
    pub seconds: f64,
    /// The target: lease + 2 s.
    pub budget_s: f64,
}

pub async fn figures(pool: &PgPool, url: &str, args: &RunArgs) -> anyhow::Result<RecoveryFigures> {
    let (jobs, lease_ms) = (args.recovery_jobs, args.recovery_lease_ms);
    clear(pool).await?;
    let mut doomed = children::bench_workers(pool, url, 1, jobs, 0, lease_ms)
        .await?
        .remove(0);
    enqueue_bulk(pool, HOLD_PREFIX.trim_end_matches('-'), jobs).await?;
    let holder = wait_held(pool, jobs).await?;
    let mut survivor = children::bench_workers(pool, url, 1, jobs, 0, lease_ms).await?;
    doomed.kill9()?;
    let killed = Instant::now();
    while held_elsewhere(pool, &holder).await? < jobs as i64 {
        anyhow::ensure!(
            killed.elapsed() < Duration::from_millis(lease_ms) * 4,
            "the jobs were not taken over within four lease lengths"
        );
        tokio::time::sleep(POLL).await;
    }
    let seconds = killed.elapsed().as_secs_f64();
    survivor
        .iter_mut()
        .for_each(|w| w.stop(Duration::from_secs(10)));
    drop(survivor);
    clear(pool).await?;
    let lease_s = lease_ms as f64 / 1e3;
    Ok(RecoveryFigures {
        jobs,
        lease_s,
        seconds,
        budget_s: lease_s + 2.0,
    })
}

/// Waits until all `jobs` are leased; returns the one owner holding them.
async fn wait_held(pool: &PgPool, jobs: usize) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let owners: Vec<(String, i64)> = sqlx::query_as(
            "SELECT lease_owner, count(*) FROM queue_jobs
             WHERE kind = $1 AND lease_owner IS NOT NULL GROUP BY lease_owner",
        )
        .bind(KIND)
        .fetch_all(pool)
        .await?;
        if let [(owner, held)] = owners.as_slice()
            && *held as usize == jobs
        {
            return Ok(owner.clone());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the worker did not lease all {jobs} jobs"
        );
        tokio::time::sleep(POLL).await;
    }
}

async fn held_elsewhere(pool: &PgPool, holder: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM queue_jobs
         WHERE kind = $1 AND lease_owner IS NOT NULL AND lease_owner <> $2",
    )
    .bind(KIND)
    .bind(holder)
    .fetch_one(pool)
    .await?)
}
