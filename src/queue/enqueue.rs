//! Enqueue (inside the caller's domain transaction) and withdraw, with the notifications
//! that wake workers ([`JOBS_CHANNEL`]) and stop the holder of a withdrawn job
//! ([`CANCEL_CHANNEL`]).

use sqlx::PgConnection;

use crate::domain::Scope;
use crate::queue::Result;
use crate::queue::{CANCEL_CHANNEL, JOBS_CHANNEL};

/// How many jobs enqueued just before a new one [`enqueue`] looks at (by id, any kind)
/// for one of its kind still waiting to be claimed. A bounded range of the primary key:
/// the due index's head can be a long walk through dead entries while an old snapshot is
/// held (docs/queue.md, "Old snapshots"), its newest end cannot.
const WAKE_LOOKBEHIND: i64 = 64;

/// Enqueues a job of the scope's domain row (the `enqueue_job` function); idempotent: at
/// most one live row per (kind, ref_id); true when the row is new.
///
/// Wakes the workers (`NOTIFY keel_jobs`) unless a job of the kind and workspace enqueued
/// just before this one is still waiting: then the workers were woken for it, or are all
/// busy and claim again as each job ends (the workspace too, since a fair claim may leave
/// one workspace's jobs waiting at its limit while another's are taken at once). A NOTIFY costs every listening backend of the database a
/// transaction to read it, whatever the channel (one per worker process), and its commit
/// holds the database-wide notification lock through its WAL flush: under a backlog, a
/// wake per job was most of what idle workers cost (docs/queue.md, "Waking workers").
pub async fn enqueue(
    conn: &mut PgConnection,
    scope: &Scope,
    kind: &str,
    ref_id: &str,
    priority: i32,
) -> Result<bool> {
    let job = Enqueue::new(kind, ref_id, priority);
    let enqueued = sqlx::query!(
        r#"SELECT inserted AS "inserted!", woken AS "woken!"
           FROM enqueue_job($1, $2, $3, $4, $5, $6, $7)"#,
        job.kind,
        job.ref_id,
        job.priority,
        job.traceparent,
        scope.workspace(),
        Enqueue::CHANNEL,
        Enqueue::LOOKBEHIND,
    )
    .fetch_one(conn)
    .await?;
    tracing::trace!(kind, woken = enqueued.woken, "enqueued");
    Ok(enqueued.inserted)
}

/// A job to enqueue, as the `enqueue_job` function (`sql/enqueue_job.sql`) takes it: for
/// [`enqueue`], and for a statement that writes the job's domain row and enqueues it in
/// the same round trip (`runs::insert`). The current span's `traceparent` (when exporting
/// traces) links the job's execution to the enqueueing trace.
pub struct Enqueue<'a> {
    pub kind: &'a str,
    pub ref_id: &'a str,
    pub priority: i32,
    pub traceparent: Option<String>,
}

impl<'a> Enqueue<'a> {
    /// The channel that wakes workers.
    pub const CHANNEL: &'static str = JOBS_CHANNEL;
    /// See [`WAKE_LOOKBEHIND`].
    pub const LOOKBEHIND: i64 = WAKE_LOOKBEHIND;

    pub fn new(kind: &'a str, ref_id: &'a str, priority: i32) -> Enqueue<'a> {
        Enqueue {
            kind,
            ref_id,
            priority,
            traceparent: crate::telemetry::current_traceparent(),
        }
    }
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
