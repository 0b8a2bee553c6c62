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
    let inserted = sqlx::query_scalar!(
        r#"WITH inserted AS (
               INSERT INTO queue_jobs (kind, ref_id, priority, traceparent, workspace_id)
               VALUES ($1, $2, $3, $4, $5)
               ON CONFLICT (kind, ref_id) DO NOTHING
               RETURNING 1
           )
           SELECT (SELECT count(*) FROM inserted) AS "inserted!" FROM pg_notify($6, $1)"#,
        kind,
        ref_id,
        priority,
        traceparent,
        scope.workspace(),
        JOBS_CHANNEL,
    )
    .fetch_one(conn)
    .await?;
    Ok(inserted > 0)
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
    let workspace = scope.workspace();
    // The same statement but for the lock it takes: a literal each, so both are checked.
    let owner: Option<Option<String>> = match locked {
        Locked::Wait => {
            sqlx::query_scalar!(
                "WITH target AS (SELECT id FROM queue_jobs
                                 WHERE kind = $1 AND ref_id = $2 AND workspace_id = $3
                                 FOR UPDATE),
                      done AS (DELETE FROM queue_jobs q WHERE id IN (SELECT id FROM target)
                               RETURNING q AS job, q.lease_owner),
                      ended AS (
                          SELECT archive_leases(array_agg(d.job), array_agg('withdrawn'::text))
                          FROM done d WHERE d.lease_owner IS NOT NULL
                      )
                 SELECT done.lease_owner FROM done, ended",
                kind,
                ref_id,
                workspace,
            )
            .fetch_optional(&mut *conn)
            .await?
        }
        Locked::Skip => {
            sqlx::query_scalar!(
                "WITH target AS (SELECT id FROM queue_jobs
                                 WHERE kind = $1 AND ref_id = $2 AND workspace_id = $3
                                 FOR UPDATE SKIP LOCKED),
                      done AS (DELETE FROM queue_jobs q WHERE id IN (SELECT id FROM target)
                               RETURNING q AS job, q.lease_owner),
                      ended AS (
                          SELECT archive_leases(array_agg(d.job), array_agg('withdrawn'::text))
                          FROM done d WHERE d.lease_owner IS NOT NULL
                      )
                 SELECT done.lease_owner FROM done, ended",
                kind,
                ref_id,
                workspace,
            )
            .fetch_optional(&mut *conn)
            .await?
        }
    };
    if matches!(owner, Some(Some(_))) || locked == Locked::Skip {
        notify(conn, CANCEL_CHANNEL, &format!("{kind}:{ref_id}")).await?;
    }
    Ok(())
}

async fn notify(conn: &mut PgConnection, channel: &str, payload: &str) -> Result<()> {
    sqlx::query!("SELECT pg_notify($1, $2)", channel, payload)
        .execute(conn)
        .await?;
    Ok(())
}
