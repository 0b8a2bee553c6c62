//! The reconciler: jobs whose lease expired are requeued, and the domain row of each
//! (a run, a media job) goes back to `queued` with its gap event, so nothing sits
//! `running` with no live worker.

use std::time::Duration;

use sqlx::PgPool;

use crate::db::Result;
use crate::jobs;
use crate::queue;
use crate::queue::snapshot::ExpiredWindow;
use crate::telemetry::metrics;

/// Expired leases one pass requeues at most.
const RECONCILE_BATCH: i64 = 100;

/// Requeues jobs whose lease expired. A pass reads the leases that expired since the
/// previous pass (`queue::snapshot::ExpiredWindow`, docs/queue.md "Old snapshots").
#[derive(Debug, Default)]
pub struct Reconciler {
    window: ExpiredWindow,
}

impl Reconciler {
    /// One pass; returns how many jobs it requeued.
    pub async fn pass(&mut self, pool: &PgPool) -> Result<usize> {
        let scan = self.window.scan();
        let mut tx = queue::begin_ordered_reads(pool).await?;
        let read_at = queue::transaction_time(&mut tx).await?;
        let expired = queue::expired(&mut tx, RECONCILE_BATCH, scan.from).await?;
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
        let all = (expired.len() as i64) < RECONCILE_BATCH;
        self.window.read(scan, read_at, all);
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
