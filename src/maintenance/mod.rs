//! Maintenance duties that run inside every worker (and `serve`), safe on many replicas at
//! once: each claims its rows with `FOR UPDATE SKIP LOCKED` or relies on a unique key.
//!
//! - boot recovery: every `queued`/`running` run has a queue row (re-enqueue if not);
//! - reconciler: jobs whose lease expired are requeued, their runs marked with a
//!   `gap.run_disconnected` event, so a run never sits `running` with no live worker;
//! - schedule dispatch: due schedules become runs (see [`schedules`]);
//! - the worker registry forgets workers that stopped heartbeating;
//! - ended leases older than a week leave the lease history;
//! - ephemeral workspaces whose retention ended leave this worker's disk (see
//!   [`workspaces`]);
//! - terminal external work items' workspaces are removed, `before_remove` first (see
//!   [`item_workspaces`]).

pub mod item_workspaces;
pub mod workspaces;

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::db::Result;
use crate::domain::Scope;
use crate::queue;
use crate::runs::AdmissionRules;
use crate::telemetry::metrics::{self, KindGauge};
use crate::{events, runs};

const RECOVERY_PAGE: i64 = 500;

/// Re-enqueues durable `queued`/`running` runs that have no queue row, in id-cursor pages,
/// in every workspace (each queue row takes its run's). The page size bounds each read,
/// not the recovery: it pages until the end.
pub async fn recover(pool: &PgPool) -> Result<u64> {
    let mut cursor = String::new();
    let mut enqueued = 0;
    loop {
        let page = runs::active_page(&mut *pool.acquire().await?, &cursor, RECOVERY_PAGE).await?;
        let Some(last) = page.last() else {
            break;
        };
        cursor = last.run_id.clone();
        let mut tx = pool.begin().await?;
        for run in &page {
            let scope = Scope::new(run.workspace_id.clone());
            let new =
                queue::enqueue(&mut tx, &scope, queue::RUN_KIND, &run.run_id, run.priority).await?;
            enqueued += u64::from(new);
        }
        tx.commit().await?;
    }
    if enqueued > 0 {
        tracing::warn!(
            enqueued,
            "boot recovery re-enqueued runs that had no queue row"
        );
    }
    Ok(enqueued)
}

/// Expired leases one pass requeues at most.
const RECONCILE_BATCH: i64 = 100;

/// How far before the previous pass a windowed pass starts reading, for leases whose
/// expiry committed just after that pass read.
const RECONCILE_OVERLAP: TimeDelta = TimeDelta::seconds(1);

/// Requeues jobs whose lease expired. A pass reads the leases that expired since the
/// previous pass (docs/queue.md, "Old snapshots"): a read from the head of the index
/// would step over the entries of every job acked since the oldest snapshot still held.
/// A pass from the head, which also finds a lease a windowed pass skipped while its row
/// was locked, runs whenever it is cheap and otherwise at most 1/20 of the time.
#[derive(Debug)]
pub struct Reconciler {
    /// Where the next windowed pass starts (the database's clock at the last pass).
    since: Option<DateTime<Utc>>,
    next_full: Instant,
}

impl Default for Reconciler {
    fn default() -> Self {
        Reconciler {
            since: None,
            next_full: Instant::now(),
        }
    }
}

impl Reconciler {
    /// One pass; returns how many jobs it requeued.
    pub async fn pass(&mut self, pool: &PgPool) -> Result<usize> {
        let started = Instant::now();
        let full = started >= self.next_full;
        let from = self.since.filter(|_| !full).map(|t| t - RECONCILE_OVERLAP);
        let mut tx = queue::begin_ordered_reads(pool).await?;
        let read_at = queue::transaction_time(&mut tx).await?;
        let expired = queue::expired(&mut tx, RECONCILE_BATCH, from).await?;
        for lease in &expired {
            queue::retry(&mut tx, lease, "worker lease expired", Duration::ZERO, true).await?;
            requeue_domain(&mut tx, lease).await?;
        }
        tx.commit().await?;
        // A full batch may have left more in its window: read it again next time.
        if (expired.len() as i64) < RECONCILE_BATCH {
            self.since = Some(read_at);
        }
        if full {
            self.next_full = Instant::now() + queue::catch_all_pause(started.elapsed());
        }
        expired
            .iter()
            .for_each(|lease| metrics::reclaimed(&lease.kind));
        if !expired.is_empty() {
            tracing::warn!(
                jobs = expired.len(),
                "requeued jobs whose worker lease expired"
            );
        }
        Ok(expired.len())
    }
}

/// Puts the domain row of a job whose lease expired back to `queued`, with its gap.
async fn requeue_domain(conn: &mut sqlx::PgConnection, lease: &queue::Lease) -> Result<()> {
    const REASON: &str = "worker_lease_expired";
    let system = &crate::domain::Actor::System;
    let scope = &lease.scope();
    match lease.kind.as_str() {
        queue::RUN_KIND => {
            let run = runs::get_by_id(conn, scope, &lease.ref_id).await?;
            if run.status() == crate::domain::RunStatus::Running {
                let (_, gap) = runs::requeue_lost(conn, scope, &run, REASON, system).await?;
                events::append(conn, scope, &gap).await?;
            }
        }
        crate::media::KIND => {
            let job = crate::media::lock(conn, scope, &lease.ref_id).await?;
            if job.status() == crate::media::MediaJobStatus::Running {
                let (_, queued) =
                    crate::media::requeue_lost(conn, scope, &job.id, REASON, system).await?;
                events::append(conn, scope, &[queued]).await?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Runs `pass` every `interval` until `stop` fires: the loop of a duty that runs apart
/// from the others.
async fn every<F, Pass>(interval: Duration, stop: CancellationToken, mut pass: F)
where
    F: FnMut() -> Pass,
    Pass: Future<Output = ()>,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        pass().await;
    }
}

/// Runs the periodic duties until `stop` fires.
pub async fn run(pool: PgPool, rules: AdmissionRules, interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reconciler = Reconciler::default();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(error) = reconciler.pass(&pool).await {
            tracing::warn!(%error, "reconciler pass failed");
        }
        if let Err(error) =
            crate::schedules::dispatch::dispatch_due(&pool, &rules, Utc::now()).await
        {
            tracing::warn!(%error, "schedule dispatch failed");
        }
        let stale_ms = (interval.as_millis() as i64 * 10).max(60_000);
        if let Err(error) = crate::system::workers::prune(&pool, stale_ms).await {
            tracing::warn!(%error, "worker registry pruning failed");
        }
        if let Err(error) = prune_lease_history(&pool).await {
            tracing::warn!(%error, "lease history pruning failed");
        }
        if metrics::enabled()
            && let Err(error) = sample_queue(&pool).await
        {
            tracing::warn!(%error, "queue metrics sampling failed");
        }
    }
}

/// Refreshes the queue gauges' snapshot: one bounded read per maintenance pass, never
/// one per export.
async fn sample_queue(pool: &PgPool) -> Result<()> {
    let mut conn = pool.acquire().await?;
    let mut kinds: Vec<KindGauge> = crate::system::stats::queue_everywhere(&mut conn)
        .await?
        .into_iter()
        .map(|k| KindGauge {
            kind: k.kind,
            depth: k.depth,
            oldest_age_ms: k.oldest_age_ms,
        })
        .collect();
    // An empty queue has no row for the kind: report zero rather than nothing.
    if !kinds.iter().any(|k| k.kind == queue::RUN_KIND) {
        kinds.push(KindGauge {
            kind: queue::RUN_KIND.to_string(),
            depth: 0,
            oldest_age_ms: None,
        });
    }
    let workers = crate::system::stats::live_workers_everywhere(
        &mut conn,
        crate::system::stats::WORKER_LIVE_MS,
    )
    .await?;
    metrics::observe_queue(kinds, workers.len() as u64);
    Ok(())
}

/// Ended leases are kept this long for diagnostics.
const LEASE_HISTORY_DAYS: i32 = 7;

async fn prune_lease_history(pool: &PgPool) -> Result<u64> {
    crate::system::leases::prune(&mut *pool.acquire().await?, LEASE_HISTORY_DAYS).await
}
