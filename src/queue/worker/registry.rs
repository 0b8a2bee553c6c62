//! The worker registry (`workers`): every worker process, on every replica, registered
//! while it runs. Its heartbeat renews the row with its leases ([`crate::queue::heartbeat`]);
//! the maintenance tick forgets rows gone silent (`store::workers::prune`).

use sqlx::PgPool;

use crate::queue::Result;

/// Registers worker `id` with its host, pid, kinds and concurrency; again is a no-op (a
/// start retried after a lost answer).
pub(super) async fn register(
    pool: &PgPool,
    id: &str,
    kinds: &[String],
    concurrency: usize,
) -> Result<()> {
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into());
    sqlx::query!(
        "INSERT INTO workers (id, hostname, pid, kinds, concurrency) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (id) DO NOTHING",
        id,
        hostname,
        std::process::id() as i32,
        kinds,
        concurrency as i32,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Removes worker `id` at its shutdown.
pub(super) async fn deregister(pool: &PgPool, id: &str) -> Result<()> {
    sqlx::query!("DELETE FROM workers WHERE id = $1", id)
        .execute(pool)
        .await?;
    Ok(())
}
