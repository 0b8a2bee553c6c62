//! Enqueue (inside the caller's domain transaction) and withdraw, with the notifications
//! that wake workers ([`JOBS_CHANNEL`]) and stop the holder of a withdrawn job
//! ([`CANCEL_CHANNEL`]).

use sqlx::PgConnection;

use crate::domain::Scope;
use crate::queue::Result;
use crate::queue::{CANCEL_CHANNEL, JOBS_CHANNEL};

/// Enqueues a job of the scope's domain row; idempotent: at most one live row per
/// (kind, ref_id); true when the row is new. The current span's `traceparent` (when exporting traces) links the job's
/// execution to the enqueueing trace.
pub async fn enqueue(
    conn: &mut PgConnection,
    scope: &Scope,
    kind: &str,
    ref_id: &str,
    priority: i32,
) -> Result<bool> {
    let traceparent = crate::telemetry::current_traceparent();
    // One statement, the notification included: one round trip in the caller's transaction.
    let inserted: i64 = sqlx::query_scalar(
        "WITH inserted AS (
             INSERT INTO queue_jobs (kind, ref_id, priority, traceparent, workspace_id)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (kind, ref_id) DO NOTHING
             RETURNING 1
         )
         SELECT (SELECT count(*) FROM inserted), pg_notify($6, $1)",
    )
    .bind(kind)
    .bind(ref_id)
    .bind(priority)
    .bind(traceparent)
    .bind(scope.workspace())
    .bind(JOBS_CHANNEL)
    .fetch_one(conn)
    .await?;
    Ok(inserted > 0)
}

/// Enqueues many jobs of one kind in one statement, with [`enqueue`]'s idempotency;
/// returns how many were new. One notification wakes the workers for all of them.
pub async fn enqueue_many(
    conn: &mut PgConnection,
    scope: &Scope,
    kind: &str,
    ref_ids: &[String],
    priority: i32,
) -> Result<u64> {
    let inserted: i64 = sqlx::query_scalar(
        "WITH inserted AS (
             INSERT INTO queue_jobs (kind, ref_id, priority, workspace_id)
             SELECT $1, ref_id, $3, $4 FROM unnest($2::text[]) AS r(ref_id)
             ON CONFLICT (kind, ref_id) DO NOTHING
             RETURNING 1
         )
         SELECT (SELECT count(*) FROM inserted), pg_notify($5, $1)",
    )
    .bind(kind)
    .bind(ref_ids)
    .bind(priority)
    .bind(scope.workspace())
    .bind(JOBS_CHANNEL)
    .fetch_one(conn)
    .await?;
    Ok(inserted as u64)
}

/// How [`remove`] treats a job row another transaction has locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locked {
    /// Wait for it.
    Wait,
    /// Leave it: its holder is a worker (its transaction, or a heartbeat renewing the
    /// lease) that will find the domain row ended. That worker is told to stop all the
    /// same, since a heartbeat alone would keep the lease, and the job, alive.
    Skip,
}

/// Withdraws a job (its domain row was cancelled); a worker holding it is told at once.
pub async fn remove(
    conn: &mut PgConnection,
    scope: &Scope,
    kind: &str,
    ref_id: &str,
    locked: Locked,
) -> Result<()> {
    let statement = match locked {
        Locked::Wait => {
            "WITH target AS (SELECT id FROM queue_jobs
                             WHERE kind = $1 AND ref_id = $2 AND workspace_id = $3 FOR UPDATE),
                  done AS (DELETE FROM queue_jobs WHERE id IN (SELECT id FROM target) RETURNING *),
                  ended AS (
                      INSERT INTO lease_history (job_id, kind, ref_id, owner, fencing_token,
                                                 claimed_at, expires_at, heartbeats, workspace_id,
                                                 outcome)
                      SELECT id, kind, ref_id, lease_owner, fencing_token, claimed_at,
                             lease_expires_at, heartbeats, workspace_id, 'withdrawn'
                      FROM done WHERE lease_owner IS NOT NULL
                  )
             SELECT lease_owner FROM done"
        }
        Locked::Skip => {
            "WITH target AS (SELECT id FROM queue_jobs
                             WHERE kind = $1 AND ref_id = $2 AND workspace_id = $3
                             FOR UPDATE SKIP LOCKED),
                  done AS (DELETE FROM queue_jobs WHERE id IN (SELECT id FROM target) RETURNING *),
                  ended AS (
                      INSERT INTO lease_history (job_id, kind, ref_id, owner, fencing_token,
                                                 claimed_at, expires_at, heartbeats, workspace_id,
                                                 outcome)
                      SELECT id, kind, ref_id, lease_owner, fencing_token, claimed_at,
                             lease_expires_at, heartbeats, workspace_id, 'withdrawn'
                      FROM done WHERE lease_owner IS NOT NULL
                  )
             SELECT lease_owner FROM done"
        }
    };
    let owner: Option<Option<String>> = sqlx::query_scalar(statement)
        .bind(kind)
        .bind(ref_id)
        .bind(scope.workspace())
        .fetch_optional(&mut *conn)
        .await?;
    if matches!(owner, Some(Some(_))) || locked == Locked::Skip {
        notify(conn, CANCEL_CHANNEL, &format!("{kind}:{ref_id}")).await?;
    }
    Ok(())
}

async fn notify(conn: &mut PgConnection, channel: &str, payload: &str) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(channel)
        .bind(payload)
        .execute(conn)
        .await?;
    Ok(())
}
