//! Queue metrics: the gauges' snapshot (depth and oldest age per kind, live workers),
//! refreshed once per maintenance pass when metrics are exported.

use sqlx::PgPool;

use crate::attempt::JobKind;
use crate::db::Result;
use crate::system;
use crate::telemetry::metrics::{self, KindGauge};

/// One pass, when metrics are exported.
pub(super) async fn pass(pool: &PgPool) {
    if metrics::enabled()
        && let Err(error) = sample_queue(pool).await
    {
        tracing::warn!(%error, "queue metrics sampling failed");
    }
}

/// Refreshes the queue gauges' snapshot: one bounded read per maintenance pass, never
/// one per export.
async fn sample_queue(pool: &PgPool) -> Result<()> {
    let mut conn = pool.acquire().await?;
    let mut kinds: Vec<KindGauge> = system::stats::queue_everywhere(&mut conn)
        .await?
        .into_iter()
        .map(|k| KindGauge {
            kind: k.kind,
            depth: k.depth,
            oldest_age_ms: k.oldest_age_ms,
        })
        .collect();
    // An empty queue has no row for the kind: report zero rather than nothing.
    if !kinds.iter().any(|k| k.kind == JobKind::Run.as_str()) {
        kinds.push(KindGauge {
            kind: JobKind::Run.as_str().to_string(),
            depth: 0,
            oldest_age_ms: None,
        });
    }
    let workers =
        system::stats::live_workers_everywhere(&mut conn, system::stats::WORKER_LIVE_MS).await?;
    metrics::observe_queue(kinds, workers.len() as u64);
    Ok(())
}
