//! Pruning: the worker registry forgets workers that stopped heartbeating, and ended
//! leases older than a week leave the lease history.

use std::time::Duration;

use sqlx::PgPool;

use crate::db::Result;
use crate::system;

/// One pass: workers silent for ten maintenance intervals (at least a minute) and lease
/// history past its keep.
pub(super) async fn pass(pool: &PgPool, interval: Duration) {
    let stale_ms = (interval.as_millis() as i64 * 10).max(60_000);
    if let Err(error) = system::workers::prune(pool, stale_ms).await {
        tracing::warn!(%error, "worker registry pruning failed");
    }
    if let Err(error) = prune_lease_history(pool).await {
        tracing::warn!(%error, "lease history pruning failed");
    }
}

/// Ended leases are kept this long for diagnostics.
const LEASE_HISTORY_DAYS: i32 = 7;

async fn prune_lease_history(pool: &PgPool) -> Result<u64> {
    crate::system::leases::prune(&mut *pool.acquire().await?, LEASE_HISTORY_DAYS).await
}
