//! The worker registry's upkeep: workers that died without deregistering are forgotten.
//! Workers register, heartbeat and deregister themselves (`queue::worker`).

use sqlx::PgPool;

use crate::db::Result;

/// Forgets workers silent for longer than `stale_ms` (they died without deregistering).
pub(crate) async fn prune(pool: &PgPool, stale_ms: i64) -> Result<u64> {
    let done = sqlx::query!(
        "DELETE FROM workers WHERE last_seen_at < now() - $1::bigint * interval '1 millisecond'",
        stale_ms,
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}
