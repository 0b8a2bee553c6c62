//! Ending an attempt: ack (the row goes, archived to `lease_history`, one job in the
//! caller's transaction or many in one statement) and nack (the row comes back later).

use std::time::Duration;

use sqlx::PgConnection;

use crate::queue::{JOBS_CHANNEL, Lease, QueuePool, in_id_order, millis};
use crate::queue::{QueueError, Result};

/// Acks a job: its row goes, in the caller's transaction with the domain change.
pub async fn complete(conn: &mut PgConnection, lease: &Lease) -> Result<()> {
    let archived = sqlx::query(
        "WITH done AS (
             DELETE FROM queue_jobs WHERE id = $1 AND fencing_token = $2 AND lease_owner = $3
             RETURNING *
         )
         INSERT INTO lease_history (job_id, kind, ref_id, owner, fencing_token, claimed_at,
                                    expires_at, heartbeats, workspace_id, outcome)
         SELECT id, kind, ref_id, lease_owner, fencing_token, claimed_at, lease_expires_at,
                heartbeats, workspace_id, 'acked'
         FROM done",
    )
    .bind(lease.job_id)
    .bind(lease.fencing_token)
    .bind(&lease.owner)
    .execute(conn)
    .await?;
    if archived.rows_affected() == 0 {
        return Err(QueueError::LeaseLost);
    }
    Ok(())
}

/// Acks many jobs in one statement, each fenced by its own token and owner; returns the
/// ids acked (a job missing from them had lost its lease). For jobs with no domain change
/// to commit alongside the ack; `run` jobs ack with [`complete`] in their own transaction.
/// The rows are looked up as [`crate::queue::heartbeat`] looks them up, and for the same reasons: as a
/// join with `unnest`, a generic plan probed the primary key once per pair for every pair,
/// 57 ms for 500 acks instead of 3.
pub async fn complete_many(pool: &QueuePool, owner: &str, held: &[(i64, i64)]) -> Result<Vec<i64>> {
    let (ids, tokens) = in_id_order(held);
    let acked = sqlx::query_scalar(
        "WITH done AS (
             DELETE FROM queue_jobs q
             WHERE q.id = ANY($1) AND q.lease_owner IS NOT DISTINCT FROM $3
               AND q.fencing_token = ($2::bigint[])[array_position($1, q.id)]
             RETURNING q.*
         ), archived AS (
             INSERT INTO lease_history (job_id, kind, ref_id, owner, fencing_token, claimed_at,
                                        expires_at, heartbeats, workspace_id, outcome)
             SELECT id, kind, ref_id, lease_owner, fencing_token, claimed_at, lease_expires_at,
                    heartbeats, workspace_id, 'acked'
             FROM done
         )
         SELECT id FROM done",
    )
    .bind(ids)
    .bind(tokens)
    .bind(owner)
    .fetch_all(&pool.0)
    .await?;
    Ok(acked)
}

/// Nacks a job: it becomes claimable again after `delay`, with the error recorded.
/// `penalty` false gives the attempt back (a graceful shutdown is not the job's fault).
pub async fn retry(
    conn: &mut PgConnection,
    lease: &Lease,
    error: &str,
    delay: Duration,
    penalty: bool,
) -> Result<()> {
    // The notification goes in the same statement: one round trip for the whole nack.
    let archived: Option<i64> = sqlx::query_scalar(
        "WITH held AS (
             SELECT * FROM queue_jobs WHERE id = $1 AND fencing_token = $2 AND lease_owner = $3 FOR UPDATE
         ), released AS (
             UPDATE queue_jobs q
             SET lease_owner = NULL, lease_expires_at = NULL, last_error = $4,
                 run_after = now() + $5 * interval '1 millisecond',
                 attempts = q.attempts - CASE WHEN $6 THEN 0 ELSE 1 END
             FROM held WHERE q.id = held.id RETURNING q.id
         ), archived AS (
             INSERT INTO lease_history (job_id, kind, ref_id, owner, fencing_token, claimed_at,
                                        expires_at, heartbeats, workspace_id, outcome)
             SELECT id, kind, ref_id, lease_owner, fencing_token, claimed_at, lease_expires_at,
                    heartbeats, workspace_id, CASE WHEN $6 THEN 'retried' ELSE 'released' END
             FROM held WHERE EXISTS (SELECT 1 FROM released)
             RETURNING job_id
         )
         SELECT job_id FROM archived, pg_notify($7, $8)",
    )
    .bind(lease.job_id)
    .bind(lease.fencing_token)
    .bind(&lease.owner)
    .bind(error)
    .bind(millis(delay))
    .bind(penalty)
    .bind(JOBS_CHANNEL)
    .bind(&lease.kind)
    .fetch_optional(conn)
    .await?;
    archived.map(|_| ()).ok_or(QueueError::LeaseLost)
}

/// Exponential backoff for the n-th failed attempt: 1 s, 2 s, 4 s … capped at 5 minutes.
pub fn backoff(attempts: i32) -> Duration {
    let exponent = attempts.clamp(1, 20) as u32 - 1;
    Duration::from_secs(2u64.saturating_pow(exponent).min(300))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(50), Duration::from_secs(300));
    }
}
