//! Holding a lease: heartbeats that renew a worker's leases, the fence every worker write
//! takes first, and the reconciler's read of leases that expired.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use crate::queue::{Lease, in_id_order, millis};
use crate::queue::{QueueError, Result};

/// Extends the leases still held and marks the worker alive in the worker registry, in one
/// statement, on the heartbeat's own connection (the worker drops it when a heartbeat hangs);
/// returns the ids of the leases renewed (the others are lost). The rows are
/// looked up by id, each with its own token (no join: joined with an `unnest`, a table
/// bloated by an old snapshot was planned as a full scan, and heartbeats that fell behind
/// the lease lost it). The owner is matched with `IS NOT DISTINCT FROM` (the same, since
/// the owner is never null) so that queue_jobs_leased (`WHERE lease_owner IS NOT NULL`)
/// cannot serve the statement: with a queue's stale statistics the planner took a walk of
/// that whole index, stepping over every entry an old snapshot keeps, for cheaper than 500
/// primary-key probes.
pub async fn heartbeat(
    conn: &mut PgConnection,
    owner: &str,
    held: &[(i64, i64)],
    lease: Duration,
) -> Result<Vec<i64>> {
    let (ids, tokens) = in_id_order(held);
    let renewed = sqlx::query_scalar!(
        "WITH alive AS (UPDATE workers SET last_seen_at = now() WHERE id = $3)
         UPDATE queue_jobs q
         SET lease_expires_at = now() + $4::bigint * interval '1 millisecond',
             heartbeats = heartbeats + 1
         WHERE q.id = ANY($1) AND q.lease_owner IS NOT DISTINCT FROM $3
           AND q.fencing_token = ($2::bigint[])[array_position($1, q.id)]
         RETURNING q.id",
        &ids,
        &tokens,
        owner,
        millis(lease),
    )
    .fetch_all(conn)
    .await?;
    Ok(renewed)
}

/// Checks, inside a worker's transaction, that it still holds the lease, and locks the
/// job row so no claim or cancellation can interleave until the transaction ends. The check
/// is the `fence_job` function (`sql/fence_job.sql`), which a domain statement may call
/// first instead (`runs::lock_with_task`).
pub async fn fence(conn: &mut PgConnection, lease: &Lease) -> Result<()> {
    let held = sqlx::query_scalar!(
        r#"SELECT fence_job($1, $2, $3) AS "held!""#,
        lease.job_id,
        lease.fencing_token,
        lease.owner,
    )
    .fetch_one(conn)
    .await?;
    held.then_some(()).ok_or(QueueError::LeaseLost)
}

/// Starts a worker transaction that holds the job's lease for its whole length.
pub async fn begin_fenced(
    pool: &PgPool,
    lease: &Lease,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = pool.begin().await?;
    fence(&mut tx, lease).await?;
    Ok(tx)
}

/// The start of the current transaction on the database's clock (`now()`), which the
/// statements of the same transaction compare leases against.
pub async fn transaction_time(conn: &mut PgConnection) -> Result<DateTime<Utc>> {
    let now = sqlx::query_scalar!(r#"SELECT now() AS "now!""#)
        .fetch_one(conn)
        .await?;
    Ok(now)
}

/// Expired leases, for the reconciler: it hands each to its kind's requeue. With `since`,
/// only leases that expired from then on: the read then skips the index entries of jobs
/// acked before, which vacuum cannot remove while an old snapshot is held. Run inside
/// [`crate::queue::begin_ordered_reads`].
pub async fn expired(
    conn: &mut PgConnection,
    limit: i64,
    since: Option<DateTime<Utc>>,
) -> Result<Vec<Lease>> {
    let leases = sqlx::query_as!(
        Lease,
        r#"SELECT id AS job_id, kind, ref_id, lease_owner AS "owner!", fencing_token, attempts,
                  max_attempts, traceparent, 0::bigint AS "due_ms!", priority, run_after,
                  workspace_id
           FROM queue_jobs
           WHERE lease_owner IS NOT NULL AND lease_expires_at < now()
             AND lease_expires_at >= coalesce($2::timestamptz, '-infinity')
           ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED"#,
        limit,
        since,
    )
    .fetch_all(conn)
    .await?;
    Ok(leases)
}
