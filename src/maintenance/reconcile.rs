//! The reconciler: jobs whose lease expired are requeued, and the domain row of each
//! (a run, a media job) goes back to `queued` with its gap event, so nothing sits
//! `running` with no live worker.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::PgPool;

use crate::db::Result;
use crate::jobs;
use crate::queue;
use crate::telemetry::metrics;

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
            let error = "worker lease expired".to_string();
            let expired = queue::Disposition::Retry {
                error,
                delay: Duration::ZERO,
            };
            queue::settle(&mut tx, lease, expired).await?;
            jobs::requeue_lost(&mut tx, lease).await?;
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
