//! The queue figures: throughput and latency with one worker process (the peer's two
//! figures, measured the same way), and throughput across worker processes (scaling).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::children;
use super::noop::{InProcess, KIND, Probe};
use super::stats::{Latency, Throughput};
use super::{POLL, RunArgs};
use keel::domain::Scope;
use keel::queue;

/// Rows per enqueue statement when enqueuing in bulk (the peer's batch size too).
const ENQUEUE_BATCH: usize = 5_000;

#[derive(Debug, Serialize, Deserialize)]
pub struct QueueFigures {
    pub throughput: Throughput,
    pub latency: Latency,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ScalingPoint {
    pub processes: usize,
    pub concurrency: usize,
    pub throughput: Throughput,
}

pub async fn figures(pool: &PgPool, url: &str, args: &RunArgs) -> anyhow::Result<QueueFigures> {
    Ok(QueueFigures {
        throughput: throughput(pool, url, args.jobs, args.concurrency, args.prefetch).await?,
        latency: latency(pool, url, args.samples, args.concurrency, args.prefetch).await?,
    })
}

/// N jobs enqueued in bulk, then drained by a worker started afterwards in this process
/// with C concurrent jobs: the clock runs from the worker's start to the N-th ack commit.
pub async fn throughput(
    pool: &PgPool,
    url: &str,
    jobs: usize,
    concurrency: usize,
    prefetch: usize,
) -> anyhow::Result<Throughput> {
    clear(pool).await?;
    enqueue_bulk(pool, "t", jobs).await?;
    let probe = Probe::default();
    let started = Instant::now();
    let worker = InProcess::start(url, concurrency, prefetch, probe.clone()).await?;
    probe.wait_acked(jobs as u64).await;
    let elapsed = started.elapsed();
    worker.stop().await?;
    Ok(Throughput::new(jobs, elapsed))
}

/// With the worker idle, jobs enqueued one at a time, each by one statement in its own
/// transaction (the peer's `addJob` is one call the same way; an explicit BEGIN and COMMIT
/// around it would add two round trips the peer's figure does not have): enqueue →
/// executor start.
pub async fn latency(
    pool: &PgPool,
    url: &str,
    samples: usize,
    concurrency: usize,
    prefetch: usize,
) -> anyhow::Result<Latency> {
    clear(pool).await?;
    let (probe, mut starts) = Probe::with_starts();
    let worker = InProcess::start(url, concurrency, prefetch, probe.clone()).await?;
    // Let the worker reach its idle wait, as the peer harness does.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut conn = pool.acquire().await?;
    let mut waits = Vec::with_capacity(samples);
    for i in 0..samples {
        let ref_id = format!("l-{i}");
        let enqueued = Instant::now();
        queue::enqueue(&mut conn, &Scope::local(), KIND, &ref_id, 0).await?;
        let (started_id, started) = starts
            .recv()
            .await
            .ok_or_else(|| anyhow::anyhow!("the bench worker stopped"))?;
        anyhow::ensure!(started_id == ref_id, "job {started_id} started out of turn");
        waits.push(started - enqueued);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    probe.wait_acked(samples as u64).await;
    worker.stop().await?;
    Latency::of(&waits).ok_or_else(|| anyhow::anyhow!("no latency sample"))
}

/// Throughput for each (processes, concurrency) pair, with separate worker processes.
pub async fn scaling(
    pool: &PgPool,
    url: &str,
    args: &RunArgs,
) -> anyhow::Result<Vec<ScalingPoint>> {
    let mut points = Vec::new();
    for &concurrency in &args.scaling_concurrency {
        for &processes in &args.scaling_processes {
            let throughput =
                multi_process(pool, url, processes, concurrency, args.prefetch, args.jobs).await?;
            points.push(ScalingPoint {
                processes,
                concurrency,
                throughput,
            });
        }
    }
    Ok(points)
}

/// N jobs enqueued in one transaction while the worker processes wait idle; the clock runs
/// from its commit until no bench job is left.
async fn multi_process(
    pool: &PgPool,
    url: &str,
    processes: usize,
    concurrency: usize,
    prefetch: usize,
    jobs: usize,
) -> anyhow::Result<Throughput> {
    clear(pool).await?;
    let mut workers =
        children::bench_workers(pool, url, processes, concurrency, prefetch, 30_000).await?;
    enqueue_bulk(pool, "s", jobs).await?;
    let started = Instant::now();
    while pending(pool).await? > 0 {
        tokio::time::sleep(POLL).await;
    }
    let elapsed = started.elapsed();
    workers
        .iter_mut()
        .for_each(|w| w.stop(Duration::from_secs(10)));
    Ok(Throughput::new(jobs, elapsed))
}

/// Enqueues `jobs` bench jobs in one transaction, in batches of [`ENQUEUE_BATCH`].
pub async fn enqueue_bulk(pool: &PgPool, prefix: &str, jobs: usize) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    let ids: Vec<String> = (0..jobs).map(|i| format!("{prefix}-{i}")).collect();
    for batch in ids.chunks(ENQUEUE_BATCH) {
        insert_jobs(&mut tx, batch).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Bench jobs, due now, many to a statement, and one notification that wakes the workers:
/// the setup of a figure, as the peer's `addJobs` (the queue enqueues one at a time, in
/// the transaction of the domain change it belongs with).
pub async fn insert_jobs(conn: &mut sqlx::PgConnection, ref_ids: &[String]) -> anyhow::Result<()> {
    sqlx::query(
        "WITH inserted AS (
             INSERT INTO queue_jobs (kind, ref_id, workspace_id)
             SELECT $1, ref_id, 'default' FROM unnest($2::text[]) AS r(ref_id)
             ON CONFLICT (kind, ref_id) DO NOTHING
         )
         SELECT pg_notify($3, $1)",
    )
    .bind(KIND)
    .bind(ref_ids)
    .bind(queue::JOBS_CHANNEL)
    .execute(conn)
    .await?;
    Ok(())
}

/// Bench jobs not yet acked.
pub async fn pending(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM queue_jobs WHERE kind = $1")
            .bind(KIND)
            .fetch_one(pool)
            .await?,
    )
}

/// Removes the bench jobs earlier figures left, so every figure starts from an empty queue.
pub async fn clear(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query("DELETE FROM queue_jobs WHERE kind = $1")
        .bind(KIND)
        .execute(pool)
        .await?;
    Ok(())
}
