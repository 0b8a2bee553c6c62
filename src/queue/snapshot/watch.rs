//! The watch on the oldest snapshot's age, which turns positioned claims on and off.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::HeldSnapshot;
use crate::queue::{QueuePool, Result};

/// A snapshot held this long means vacuum is leaving dead index entries at the head of the
/// claim order: positioned claims go on. Longer than any transaction Keel itself keeps
/// open (an enqueue that commits late included), shorter than the seconds after which a
/// busy queue's full claims step over thousands of entries.
const OLD_SNAPSHOT: Duration = Duration::from_secs(2);

/// How often a worker looks at the age of the oldest snapshot.
const SNAPSHOT_CHECK: Duration = Duration::from_secs(1);

/// How long the oldest snapshot in this database has been held (zero when none is): the
/// oldest transaction start among the client sessions holding back vacuum's horizon,
/// with a snapshot (`backend_xmin`) or a transaction id of their own (`backend_xid`).
/// Sessions of other databases hold back no row of this one's tables.
pub async fn oldest_snapshot(pool: &QueuePool) -> Result<Duration> {
    let seconds = sqlx::query_scalar!(
        r#"SELECT coalesce(extract(epoch FROM now() - min(xact_start)), 0)::float8 AS "age!"
           FROM pg_stat_activity
           WHERE datname = current_database() AND backend_type = 'client backend'
             AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
             AND pid <> pg_backend_pid()"#,
    )
    .fetch_one(&pool.0)
    .await?;
    Ok(Duration::try_from_secs_f64(seconds).unwrap_or_default())
}

/// Turns positioned claims on while the oldest snapshot is older than [`OLD_SNAPSHOT`]
/// and off once it is not, looking every [`SNAPSHOT_CHECK`], off the claim path. The
/// cause is watched, not a symptom: a claim's latency also grows with the distance to the
/// database, and a worker 1 ms away from it read slow claims as an old snapshot.
pub(super) async fn watch(pool: QueuePool, state: Arc<HeldSnapshot>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SNAPSHOT_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match oldest_snapshot(&pool).await {
            Ok(age) => {
                let old = age >= OLD_SNAPSHOT;
                if state.held.swap(old, Ordering::Relaxed) != old {
                    tracing::info!(
                        ?age,
                        "oldest snapshot {}; positioned claims {}",
                        if old { "old" } else { "recent" },
                        if old { "on" } else { "off" }
                    );
                }
            }
            Err(error) => tracing::warn!(%error, "could not read the oldest snapshot's age"),
        }
    }
}
