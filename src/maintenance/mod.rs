//! Maintenance duties that run inside every worker (and `serve`), safe on many replicas at
//! once: each claims its rows with `FOR UPDATE SKIP LOCKED` or relies on a unique key.
//!
//! One duty per file, as River's `internal/maintenance/` and Oban's plugins are:
//! - [`recover`]: at start, every `queued`/`running` run has a queue row;
//! - [`reconcile`]: jobs whose lease expired are requeued, their runs marked with a
//!   `gap.run_disconnected` event, so a run never sits `running` with no live worker;
//! - [`schedules`]: due schedules become runs;
//! - [`client_leases`]: client-orchestrated runs whose client went silent fail;
//! - [`prune`]: the worker registry forgets silent workers, old lease history goes, and
//!   events and transitions past the history retention;
//! - [`metrics`]: the queue gauges' snapshot;
//! - [`workspaces`]: ephemeral workspaces whose retention ended leave this worker's disk;
//! - [`item_workspaces`]: terminal external work items' workspaces are removed,
//!   `before_remove` first.
//!
//! The first six run on one tick ([`run`]); the two workspace duties have loops of their
//! own (a removal may wait on a slow disk or an hour-long hook).

mod client_leases;
pub(crate) mod item_workspaces;
mod metrics;
mod prune;
mod reconcile;
mod recover;
mod schedules;
pub(crate) mod workspaces;

pub use reconcile::Reconciler;
pub use recover::recover;

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::runs::AdmissionRules;

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

/// Runs the periodic duties until `stop` fires; `history_retention_days` 0 keeps events
/// and transitions for ever.
pub async fn run(
    pool: PgPool,
    rules: AdmissionRules,
    interval: Duration,
    history_retention_days: u32,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reconciler = Reconciler::default();
    let mut history = prune::HistoryRetention::new(history_retention_days);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(error) = reconciler.pass(&pool).await {
            tracing::warn!(%error, "reconciler pass failed");
        }
        schedules::pass(&pool, &rules).await;
        client_leases::pass(&pool).await;
        prune::pass(&pool, interval).await;
        if let Some(history) = &mut history {
            history.pass(&pool).await;
        }
        metrics::pass(&pool).await;
    }
}
