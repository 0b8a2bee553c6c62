//! The worker registry: every worker process, on every replica, with a fresh heartbeat.

use sqlx::PgPool;

use super::Result;

pub async fn register(pool: &PgPool, id: &str, kinds: &[String], concurrency: usize) -> Result<()> {
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into());
    sqlx::query(
        "INSERT INTO workers (id, hostname, pid, kinds, concurrency) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(hostname)
    .bind(std::process::id() as i32)
    .bind(kinds)
    .bind(concurrency as i32)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn deregister(pool: &PgPool, id: &str) -> Result<()> {
    sqlx::query("DELETE FROM workers WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Forgets workers silent for longer than `stale_ms` (they died without deregistering).
pub async fn prune(pool: &PgPool, stale_ms: i64) -> Result<u64> {
    let done = sqlx::query(
        "DELETE FROM workers WHERE last_seen_at < now() - $1 * interval '1 millisecond'",
    )
    .bind(stale_ms)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}
