//! The job queue: one table for every job kind, leased to workers with fencing tokens.
//!
//! Protocol (docs/queue.md), one file per part: [`mod@enqueue`] inside the domain transaction
//! (and withdraw, with the notifications that wake and stop workers); [`mod@claim`] with
//! `FOR UPDATE SKIP LOCKED`, taking due rows and rows whose lease expired, bumping the
//! fencing token; [`lease`]: heartbeats on the worker's own connections, and the fence every
//! worker write re-checks (token and owner); [`mod@settle`]: every attempt ends with one
//! [`Disposition`], in the same transaction as the domain change, or many to a statement
//! ([`settle_many`]). [`fair`] is the claim across workspaces; [`worker`] the process that
//! runs all of it.

pub(crate) mod claim;
pub(crate) mod enqueue;
pub mod fair;
pub(crate) mod lease;
pub(crate) mod reach;
pub(crate) mod settle;
pub(crate) mod snapshot;
pub mod worker;

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::domain::Scope;

pub use claim::{begin_ordered_reads, claim};
pub use enqueue::{Enqueue, Locked, enqueue, remove};
pub use lease::{begin_fenced, expired, fence, heartbeat, transaction_time};
pub use settle::{Disposition, Settlement, backoff, settle, settle_many};
pub use snapshot::{COMMIT_SLACK, LATE_COMMIT_SLACK, Positions, WIDE_READ_EVERY, claim_from};

/// Errors of the queue. The store, which enqueues inside its own transactions, turns them
/// into its errors (`From<QueueError> for StoreError`).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// A fenced write found that this worker no longer holds the job's lease.
    #[error("the lease on this job was lost")]
    LeaseLost,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl QueueError {
    /// Whether the database could not be reached ([`reach::unreachable`]).
    pub(crate) fn is_unreachable(&self) -> bool {
        matches!(self, QueueError::Database(error) if reach::unreachable(error))
    }
}

pub(crate) type Result<T, E = QueueError> = std::result::Result<T, E>;

/// NOTIFY channel: a job was enqueued (payload: its kind).
pub const JOBS_CHANNEL: &str = "keel_jobs";

/// NOTIFY channel: a leased job was withdrawn (payload: `kind:ref_id`).
pub(crate) const CANCEL_CHANNEL: &str = "keel_cancel";

/// A claimed job: proof of a lease, valid while `fencing_token` matches the row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Lease {
    pub job_id: i64,
    pub(crate) kind: String,
    pub ref_id: String,
    /// The worker holding the lease (the fence checks it with the token).
    pub owner: String,
    pub fencing_token: i64,
    pub attempts: i32,
    pub(crate) max_attempts: i32,
    /// The enqueueing span's W3C trace context: the execution joins that trace.
    pub(crate) traceparent: Option<String>,
    /// How long the job had been due when claimed, in milliseconds (0 outside a claim).
    #[sqlx(default)]
    pub(crate) due_ms: i64,
    /// Where the job stood in claim order (see [`Positions`]).
    pub(crate) priority: i32,
    pub run_after: DateTime<Utc>,
    /// The workspace of the job's domain row: the executor's writes go there.
    pub workspace_id: String,
}

/// `query_as!` of the [`Lease`]s a claim takes: `$before` (its `WITH …, picked AS (…),`, the
/// ids to lease, and whatever else comes before), then `leased`, which leases them to owner
/// `$1` for `$2` milliseconds, and the select of its leases, then `$after` (its
/// `FROM leased …`).
macro_rules! query_leases {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            Lease,
            $before
                + r#" leased AS (
                     UPDATE queue_jobs q
                     SET lease_owner = $1,
                         lease_expires_at = now() + $2::bigint * interval '1 millisecond',
                         claimed_at = now(), fencing_token = fencing_token + 1,
                         attempts = attempts + 1, heartbeats = 0
                     WHERE q.id = ANY(ARRAY(SELECT id FROM picked))
                     RETURNING q.id AS job_id, q.kind, q.ref_id, q.lease_owner AS owner,
                               q.fencing_token, q.attempts, q.max_attempts, q.traceparent,
                               q.priority, q.run_after, q.workspace_id,
                               (extract(epoch FROM now() - q.run_after) * 1000)::bigint
                                   AS due_ms
                 )
                 SELECT job_id AS "job_id!", kind AS "kind!", ref_id AS "ref_id!",
                        owner AS "owner!", fencing_token AS "fencing_token!",
                        attempts AS "attempts!", max_attempts AS "max_attempts!",
                        traceparent, due_ms AS "due_ms!", priority AS "priority!",
                        run_after AS "run_after!", workspace_id AS "workspace_id!" "#
                + $after
            $(, $arg)*
        )
    };
}
pub(crate) use query_leases;

impl Lease {
    /// The workspace the job's executor acts in.
    pub(crate) fn scope(&self) -> Scope {
        Scope::new(self.workspace_id.clone())
    }
}

/// Connections for the queue's own statements (claims, heartbeats, the snapshot check,
/// settles many to a statement), each of them one round trip: the planner settings of
/// ordered reads ([`begin_ordered_reads`] says why) are set for the whole session in the
/// startup packet instead of by a `BEGIN; SET LOCAL …` and a `COMMIT` around every
/// claim; with `plan_cache_mode = force_custom_plan` a statement can stay prepared (no
/// Parse round trip each time) and is still planned with its own values every time (a
/// generic plan, made blind to the arrays and positions, read seconds of index after an
/// old snapshot's release); and a connection is not pinged before each use (a broken one
/// fails its statement, which the worker retries on a fresh one).
#[derive(Clone, Debug)]
pub struct QueuePool(PgPool);

impl QueuePool {
    /// At most `size` connections, opened when first needed, with `pool`'s options.
    pub fn new(pool: &PgPool, size: u32) -> QueuePool {
        let options = (*pool.connect_options())
            .clone()
            .options(claim::ORDERED_READS);
        QueuePool(
            PgPoolOptions::new()
                .max_connections(size)
                .acquire_timeout(Duration::from_secs(10))
                .test_before_acquire(false)
                .connect_lazy_with(options),
        )
    }

    /// Opens `count` connections at once, ahead of their first statements: each takes a
    /// few round trips to open (startup, authentication), which a database far away turns
    /// into a wait in front of a worker's first claim.
    pub(crate) async fn open(&self, count: usize) -> Result<()> {
        futures_util::future::try_join_all((0..count).map(|_| self.0.acquire())).await?;
        Ok(())
    }

    /// The connections themselves, for statements the queue does not run (a test reading
    /// a session's statistics).
    pub fn pool(&self) -> &PgPool {
        &self.0
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The (id, token) pairs as two arrays in ascending id order. Every statement that locks
/// many job rows (heartbeat, batched ack) takes them in id order, so two of them running
/// at once (a heartbeat renewing a job whose ack is in flight) cannot deadlock.
fn in_id_order(held: &[(i64, i64)]) -> (Vec<i64>, Vec<i64>) {
    let mut held = held.to_vec();
    held.sort_unstable();
    held.into_iter().unzip()
}
