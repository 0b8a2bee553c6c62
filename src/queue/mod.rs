//! The job queue: one table for every job kind, leased to workers with fencing tokens.
//!
//! Protocol (docs/queue.md): enqueue inside the domain transaction; claim with
//! `FOR UPDATE SKIP LOCKED`, taking due rows and rows whose lease expired, bumping the
//! fencing token; heartbeat on its own connection; every worker write re-checks the token
//! and owner ([`fence`]); ack deletes the row in the same transaction as the domain change.

pub mod fair;
pub mod worker;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

use crate::domain::Scope;
use crate::store::{Result, StoreError};

pub const RUN_KIND: &str = "run";
/// NOTIFY channel: a job was enqueued (payload: its kind).
pub const JOBS_CHANNEL: &str = "keel_jobs";
/// NOTIFY channel: a leased job was withdrawn (payload: `kind:ref_id`).
pub const CANCEL_CHANNEL: &str = "keel_cancel";

/// A claimed job: proof of a lease, valid while `fencing_token` matches the row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Lease {
    pub job_id: i64,
    pub kind: String,
    pub ref_id: String,
    pub owner: String,
    pub fencing_token: i64,
    pub attempts: i32,
    pub max_attempts: i32,
    /// The enqueueing span's W3C trace context: the execution joins that trace.
    pub traceparent: Option<String>,
    /// How long the job had been due when claimed, in milliseconds (0 outside a claim).
    #[sqlx(default)]
    pub due_ms: i64,
    /// Where the job stood in claim order (see [`Positions`]).
    pub priority: i32,
    pub run_after: DateTime<Utc>,
    /// The workspace of the job's domain row: the executor's writes go there.
    pub workspace_id: String,
}

impl Lease {
    /// The workspace the job's executor acts in.
    pub fn scope(&self) -> Scope {
        Scope::new(self.workspace_id.clone())
    }
}

/// Where a worker's claims of one kind have reached in claim order: for each priority it
/// claimed, the latest `run_after` it took. [`claim_from`] reads each of these priorities
/// from there, and every other priority from its head.
#[derive(Debug, Clone, Default)]
pub struct Positions {
    reached: BTreeMap<i32, DateTime<Utc>>,
    /// When [`Positions::slack`] last gave [`LATE_COMMIT_SLACK`].
    wide_at: Option<Instant>,
}

impl Positions {
    /// Priorities remembered; past this, the lowest is forgotten (read from its head again).
    const MOST: usize = 32;

    /// Moves the position of the lease's priority up to the lease.
    pub fn advance(&mut self, lease: &Lease) {
        let at = self
            .reached
            .entry(lease.priority)
            .or_insert(lease.run_after);
        *at = (*at).max(lease.run_after);
        if self.reached.len() > Self::MOST {
            self.reached.pop_first();
        }
    }

    /// How far behind the positions the next [`claim_from`] reads: [`LATE_COMMIT_SLACK`]
    /// once every [`WIDE_READ_EVERY`], [`COMMIT_SLACK`] otherwise.
    pub fn slack(&mut self) -> Duration {
        let now = Instant::now();
        match self.wide_at {
            Some(at) if now.duration_since(at) < WIDE_READ_EVERY => COMMIT_SLACK,
            _ => {
                self.wide_at = Some(now);
                LATE_COMMIT_SLACK
            }
        }
    }

    /// Each claimed priority, highest first, with the `run_after` to read it from: its
    /// position less `slack`.
    fn starts(&self, slack: Duration) -> (Vec<i32>, Vec<DateTime<Utc>>) {
        let slack = chrono::Duration::from_std(slack).unwrap_or_default();
        self.reached
            .iter()
            .rev()
            .map(|(&p, &at)| (p, at - slack))
            .unzip()
    }

    /// The ranges of priorities no claim has reached, as (lowest, highest), highest first:
    /// with [`Positions::starts`], the whole of claim order.
    fn unclaimed(&self) -> (Vec<i32>, Vec<i32>) {
        let mut ranges = Vec::with_capacity(self.reached.len() + 1);
        // The highest priority not covered yet; None below i32::MIN.
        let mut above = Some(i32::MAX);
        for &priority in self.reached.keys().rev() {
            if let Some(highest) = above
                && priority < highest
            {
                ranges.push((priority + 1, highest));
            }
            above = priority.checked_sub(1);
        }
        if let Some(highest) = above {
            ranges.push((i32::MIN, highest));
        }
        ranges.into_iter().unzip()
    }
}

/// Enqueues a job of the scope's domain row; idempotent: at most one live row per
/// (kind, ref_id). `traceparent` links the job's execution to the enqueueing trace.
pub async fn enqueue(
    conn: &mut PgConnection,
    scope: &Scope,
    kind: &str,
    ref_id: &str,
    priority: i32,
    traceparent: Option<&str>,
) -> Result<()> {
    // One statement, the notification included: one round trip in the caller's transaction.
    sqlx::query(
        "WITH inserted AS (
             INSERT INTO queue_jobs (kind, ref_id, priority, traceparent, workspace_id)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (kind, ref_id) DO NOTHING
         )
         SELECT pg_notify($6, $1)",
    )
    .bind(kind)
    .bind(ref_id)
    .bind(priority)
    .bind(traceparent)
    .bind(scope.workspace())
    .bind(JOBS_CHANNEL)
    .execute(conn)
    .await?;
    Ok(())
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
    let skip = if locked == Locked::Skip {
        "SKIP LOCKED"
    } else {
        ""
    };
    let owner: Option<Option<String>> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "WITH target AS (SELECT id FROM queue_jobs
                         WHERE kind = $1 AND ref_id = $2 AND workspace_id = $3 FOR UPDATE {skip}),
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
    )))
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

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Connections for the queue's own statements (claims, heartbeats, batched acks, the
/// snapshot check), each of them one round trip: the planner settings of ordered reads
/// ([`begin_ordered_reads`] says why) are set for the whole session in the startup
/// packet instead of by a `BEGIN; SET LOCAL …` and a `COMMIT` around every claim; with
/// `plan_cache_mode = force_custom_plan` a statement can stay prepared (no Parse round
/// trip each time) and is still planned with its own values every time (a generic plan,
/// made blind to the arrays and positions, read seconds of index after an old snapshot's
/// release); and a connection is not pinged before each use (a broken one fails its
/// statement, which the worker retries on a fresh one).
#[derive(Clone, Debug)]
pub struct QueuePool(PgPool);

impl QueuePool {
    /// At most `size` connections, opened when first needed, with `pool`'s options.
    pub fn new(pool: &PgPool, size: u32) -> QueuePool {
        let options = (*pool.connect_options()).clone().options([
            ("enable_sort", "off"),
            ("enable_bitmapscan", "off"),
            ("enable_seqscan", "off"),
            ("jit", "off"),
            ("plan_cache_mode", "force_custom_plan"),
        ]);
        QueuePool(
            PgPoolOptions::new()
                .max_connections(size)
                .acquire_timeout(Duration::from_secs(10))
                .test_before_acquire(false)
                .connect_lazy_with(options),
        )
    }

    /// The connections themselves, for statements the queue does not run (a test reading
    /// a session's statistics).
    pub fn pool(&self) -> &PgPool {
        &self.0
    }
}

/// Claims up to `limit` jobs of the given kinds: due pending jobs by priority, and jobs
/// whose lease expired (their worker died or hung). One statement, one round trip.
pub async fn claim(
    pool: &QueuePool,
    owner: &str,
    kinds: &[String],
    limit: i64,
    lease: Duration,
) -> Result<Vec<Lease>> {
    // The picked rows are leased by an array of ids, not joined: a queue's statistics are
    // always stale (analyzed while the table was near empty), and the join was planned as
    // a walk of the whole primary key, every entry an old snapshot keeps included (1.2
    // million buffers for 114 rows under a held snapshot).
    let leases = sqlx::query_as(
        "WITH expired AS (
             SELECT id FROM queue_jobs
             WHERE lease_owner IS NOT NULL AND lease_expires_at < now() AND kind = ANY($3)
             ORDER BY lease_expires_at LIMIT $4 FOR UPDATE SKIP LOCKED
         ), due AS (
             -- Per kind, so each read is one ordered scan of queue_jobs_due. With several
             -- kinds, rows locked past the outer LIMIT are only held until this statement
             -- commits.
             SELECT j.id FROM unnest($3::text[]) AS k(kind) CROSS JOIN LATERAL (
                 SELECT id, priority, run_after FROM queue_jobs
                 WHERE kind = k.kind AND lease_owner IS NULL AND run_after <= now()
                 ORDER BY priority DESC, run_after, id LIMIT $4 FOR UPDATE SKIP LOCKED
             ) j
             ORDER BY j.priority DESC, j.run_after, j.id LIMIT $4
         ), picked AS (
             SELECT id FROM expired UNION ALL SELECT id FROM due LIMIT $4
         ), ended AS (
             INSERT INTO lease_history (job_id, kind, ref_id, owner, fencing_token, claimed_at,
                                        expires_at, heartbeats, workspace_id, outcome)
             SELECT id, kind, ref_id, lease_owner, fencing_token, claimed_at, lease_expires_at,
                    heartbeats, workspace_id, 'expired'
             FROM queue_jobs
             WHERE id IN (SELECT id FROM expired) AND id IN (SELECT id FROM picked)
         ), leased AS (
             UPDATE queue_jobs q
             SET lease_owner = $1, lease_expires_at = now() + $2 * interval '1 millisecond',
                 claimed_at = now(), fencing_token = fencing_token + 1,
                 attempts = attempts + 1, heartbeats = 0
             WHERE q.id = ANY(ARRAY(SELECT id FROM picked))
             RETURNING q.id AS job_id, q.kind, q.ref_id, q.lease_owner AS owner,
                       q.fencing_token, q.attempts, q.max_attempts, q.traceparent, q.priority,
                       q.run_after, q.workspace_id,
                       (extract(epoch FROM now() - q.run_after) * 1000)::bigint AS due_ms
         )
         SELECT * FROM leased ORDER BY priority DESC, run_after, job_id",
    )
    .bind(owner)
    .bind(millis(lease))
    .bind(kinds)
    .bind(limit)
    .fetch_all(&pool.0)
    .await?;
    Ok(leases)
}

/// Starts a transaction for the queue's ordered reads outside a [`QueuePool`] (the
/// reconciler's scans for expired leases): it leaves the planner one way to run them, a
/// walk of the index in the order read, which stops at the LIMIT. A queue's statistics
/// describe whatever the table held at the last ANALYZE. While an old snapshot was held,
/// an ANALYZE that sampled mostly dead rows estimated a few live ones, and the planner
/// then read every entry of the kind through a bitmap and sorted them: a claim took 2 s
/// instead of 13 ms, and the queue ran at a quarter of its rate for a minute, until the
/// next ANALYZE. Sorting what an ordered read returns, reading through a bitmap and
/// scanning the heap are all plans that read everything matching before the LIMIT
/// counts, so they are turned off here (for this transaction only; off means priced out,
/// so a sort with no other way is still done). JIT goes too: the price of what is turned
/// off puts every claim far above `jit_above_cost`, and compiling each claim took longer
/// than running it.
pub async fn begin_ordered_reads(
    pool: &PgPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    Ok(pool
        .begin_with(
            "BEGIN; SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off;
             SET LOCAL enable_seqscan = off; SET LOCAL jit = off",
        )
        .await?)
}

/// How long the oldest snapshot in this database has been held (zero when none is): the
/// oldest transaction start among the client sessions holding back vacuum's horizon,
/// with a snapshot (`backend_xmin`) or a transaction id of their own (`backend_xid`).
/// Sessions of other databases hold back no row of this one's tables.
pub async fn oldest_snapshot(pool: &QueuePool) -> Result<Duration> {
    let seconds: f64 = sqlx::query_scalar(
        "SELECT coalesce(extract(epoch FROM now() - min(xact_start)), 0)::float8
         FROM pg_stat_activity
         WHERE datname = current_database() AND backend_type = 'client backend'
           AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
           AND pid <> pg_backend_pid()",
    )
    .fetch_one(&pool.0)
    .await?;
    Ok(Duration::try_from_secs_f64(seconds).unwrap_or_default())
}

/// Enqueues that commit this long after their `run_after` was set (their transaction's
/// start) are found by the next [`claim_from`].
pub const COMMIT_SLACK: Duration = Duration::from_millis(25);
/// Enqueues that commit up to this long after their `run_after` are found by a
/// [`claim_from`] within [`WIDE_READ_EVERY`]; later ones wait for a full [`claim`].
pub const LATE_COMMIT_SLACK: Duration = Duration::from_millis(500);
/// How often a worker's positioned claims of a kind read [`LATE_COMMIT_SLACK`] behind its
/// positions. Everything in that stretch has been claimed but for the rare late commit,
/// and while an old snapshot is held each claimed job still has its entry there, which
/// the read steps over with a heap visit: at 12,000 jobs/s, 6,000 of them. Read so on every
/// claim, that stretch was most of the database's work (3,300 buffers a claim).
pub const WIDE_READ_EVERY: Duration = Duration::from_millis(100);

/// Claims due jobs of one kind from where this worker's claims have reached: the hot
/// path of a busy worker. Each priority it has claimed is read from its position (less
/// `slack`, from [`Positions::slack`]) instead of from the head of queue_jobs_due, where
/// the entries of jobs already claimed lie; the priorities between are read from their
/// head (entries of priorities nobody claims from here are few). Vacuum normally removes those entries at
/// once, but while any transaction holds an old snapshot it cannot, and a read from the
/// head then steps over every job claimed since. What this misses (expired leases,
/// enqueues that committed late) the full [`claim`] finds. One statement, one round trip.
pub async fn claim_from(
    pool: &QueuePool,
    owner: &str,
    kind: &str,
    from: &Positions,
    slack: Duration,
    limit: i64,
    lease: Duration,
) -> Result<Vec<Lease>> {
    let (priorities, starts) = from.starts(slack);
    let (lowest, highest) = from.unclaimed();
    // A claimed priority is read with `priority =`, so its position bounds where the index
    // scan starts; read as a range of priorities, the scan would start at the range's head
    // and step over (in the index, if not the heap) every entry behind the position. The
    // picked rows are leased by an array of ids, as in [`claim`].
    let leases = sqlx::query_as(
        "WITH candidates AS (
             SELECT j.* FROM unnest($5::int[], $6::timestamptz[]) AS s(priority, from_ts)
             CROSS JOIN LATERAL (
                 SELECT id, priority, run_after FROM queue_jobs
                 WHERE kind = $3 AND lease_owner IS NULL AND priority = s.priority
                   AND run_after >= s.from_ts AND run_after <= now()
                 ORDER BY priority DESC, run_after, id LIMIT $4 FOR UPDATE SKIP LOCKED
             ) j
             UNION ALL
             SELECT j.* FROM unnest($7::int[], $8::int[]) AS s(lowest, highest)
             CROSS JOIN LATERAL (
                 SELECT id, priority, run_after FROM queue_jobs
                 WHERE kind = $3 AND lease_owner IS NULL
                   AND priority BETWEEN s.lowest AND s.highest AND run_after <= now()
                 ORDER BY priority DESC, run_after, id LIMIT $4 FOR UPDATE SKIP LOCKED
             ) j
         ), picked AS (
             SELECT id FROM candidates ORDER BY priority DESC, run_after, id LIMIT $4
         ), leased AS (
             UPDATE queue_jobs q
             SET lease_owner = $1, lease_expires_at = now() + $2 * interval '1 millisecond',
                 claimed_at = now(), fencing_token = fencing_token + 1,
                 attempts = attempts + 1, heartbeats = 0
             WHERE q.id = ANY(ARRAY(SELECT id FROM picked))
             RETURNING q.id AS job_id, q.kind, q.ref_id, q.lease_owner AS owner,
                       q.fencing_token, q.attempts, q.max_attempts, q.traceparent, q.priority,
                       q.run_after, q.workspace_id,
                       (extract(epoch FROM now() - q.run_after) * 1000)::bigint AS due_ms
         )
         SELECT * FROM leased ORDER BY priority DESC, run_after, job_id",
    )
    .bind(owner)
    .bind(millis(lease))
    .bind(kind)
    .bind(limit)
    .bind(priorities)
    .bind(starts)
    .bind(lowest)
    .bind(highest)
    .fetch_all(&pool.0)
    .await?;
    Ok(leases)
}

/// The (id, token) pairs as two arrays in ascending id order. Every statement that locks
/// many job rows (heartbeat, batched ack) takes them in id order, so two of them running
/// at once (a heartbeat renewing a job whose ack is in flight) cannot deadlock.
fn in_id_order(held: &[(i64, i64)]) -> (Vec<i64>, Vec<i64>) {
    let mut held = held.to_vec();
    held.sort_unstable();
    held.into_iter().unzip()
}

/// Extends the leases still held and marks the worker alive in the worker registry, in one
/// statement; returns the ids of the leases renewed (the others are lost). The rows are
/// looked up by id, each with its own token (no join: joined with an `unnest`, a table
/// bloated by an old snapshot was planned as a full scan, and heartbeats that fell behind
/// the lease lost it). The owner is matched with `IS NOT DISTINCT FROM` (the same, since
/// the owner is never null) so that queue_jobs_leased (`WHERE lease_owner IS NOT NULL`)
/// cannot serve the statement: with a queue's stale statistics the planner took a walk of
/// that whole index, stepping over every entry an old snapshot keeps, for cheaper than 500
/// primary-key probes.
pub async fn heartbeat(
    pool: &QueuePool,
    owner: &str,
    held: &[(i64, i64)],
    lease: Duration,
) -> Result<Vec<i64>> {
    let (ids, tokens) = in_id_order(held);
    let renewed = sqlx::query_scalar(
        "WITH alive AS (UPDATE workers SET last_seen_at = now() WHERE id = $3)
         UPDATE queue_jobs q
         SET lease_expires_at = now() + $4 * interval '1 millisecond', heartbeats = heartbeats + 1
         WHERE q.id = ANY($1) AND q.lease_owner IS NOT DISTINCT FROM $3
           AND q.fencing_token = ($2::bigint[])[array_position($1, q.id)]
         RETURNING q.id",
    )
    .bind(ids)
    .bind(tokens)
    .bind(owner)
    .bind(millis(lease))
    .fetch_all(&pool.0)
    .await?;
    Ok(renewed)
}

/// Checks, inside a worker's transaction, that it still holds the lease, and locks the
/// job row so no claim or cancellation can interleave until the transaction ends.
pub async fn fence(conn: &mut PgConnection, lease: &Lease) -> Result<()> {
    sqlx::query_scalar::<_, i64>(
        "SELECT id FROM queue_jobs WHERE id = $1 AND fencing_token = $2 AND lease_owner = $3
         FOR UPDATE",
    )
    .bind(lease.job_id)
    .bind(lease.fencing_token)
    .bind(&lease.owner)
    .fetch_optional(conn)
    .await?
    .map(|_| ())
    .ok_or(StoreError::LeaseLost)
}

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
        return Err(StoreError::LeaseLost);
    }
    Ok(())
}

/// Acks many jobs in one statement, each fenced by its own token and owner; returns the
/// ids acked (a job missing from them had lost its lease). For jobs with no domain change
/// to commit alongside the ack; `run` jobs ack with [`complete`] in their own transaction.
/// The rows are looked up as [`heartbeat`] looks them up, and for the same reasons: as a
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
    archived.map(|_| ()).ok_or(StoreError::LeaseLost)
}

/// Exponential backoff for the n-th failed attempt: 1 s, 2 s, 4 s … capped at 5 minutes.
pub fn backoff(attempts: i32) -> Duration {
    let exponent = attempts.clamp(1, 20) as u32 - 1;
    Duration::from_secs(2u64.saturating_pow(exponent).min(300))
}

/// Expired leases, for the reconciler: it hands each to its kind's requeue. With `since`,
/// only leases that expired from then on: the read then skips the index entries of jobs
/// acked before, which vacuum cannot remove while an old snapshot is held. Run inside
/// [`begin_ordered_reads`].
pub async fn expired(
    conn: &mut PgConnection,
    limit: i64,
    since: Option<DateTime<Utc>>,
) -> Result<Vec<Lease>> {
    let leases = sqlx::query_as(
        "SELECT id AS job_id, kind, ref_id, lease_owner AS owner, fencing_token, attempts,
                max_attempts, traceparent, priority, run_after, workspace_id
         FROM queue_jobs
         WHERE lease_owner IS NOT NULL AND lease_expires_at < now()
           AND lease_expires_at >= coalesce($2, '-infinity')
         ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .persistent(false)
    .bind(limit)
    .bind(since)
    .fetch_all(conn)
    .await?;
    Ok(leases)
}

/// A catch-all read (a full claim, a scan for expired leases from the head of the index)
/// that took `cost` runs again only after this long, so it takes at most
/// 1/[`CATCH_ALL_SPACING`] of the time however slow an old snapshot makes it.
pub fn catch_all_pause(cost: Duration) -> Duration {
    cost * CATCH_ALL_SPACING
}

pub const CATCH_ALL_SPACING: u32 = 20;

/// Starts a worker transaction that holds the job's lease for its whole length.
pub async fn begin_fenced(
    pool: &PgPool,
    lease: &Lease,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = pool.begin().await?;
    fence(&mut tx, lease).await?;
    Ok(tx)
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

    fn reached<const N: usize>(at: [(i32, DateTime<Utc>); N]) -> Positions {
        Positions {
            reached: BTreeMap::from(at),
            wide_at: None,
        }
    }

    #[test]
    fn positioned_claims_read_far_behind_their_positions_only_once_in_a_while() {
        let mut positions = Positions::default();
        assert_eq!(positions.slack(), LATE_COMMIT_SLACK);
        assert_eq!(positions.slack(), COMMIT_SLACK);
        positions.wide_at = Some(Instant::now() - WIDE_READ_EVERY);
        assert_eq!(positions.slack(), LATE_COMMIT_SLACK);
        assert_eq!(positions.slack(), COMMIT_SLACK);
    }

    #[test]
    fn positions_cut_claim_order_into_claimed_priorities_and_unclaimed_ranges() {
        let slack = Duration::from_secs(1);
        let (t, u) = (Utc::now(), Utc::now() - chrono::Duration::minutes(1));
        let less = |at: DateTime<Utc>| at - chrono::Duration::seconds(1);
        assert_eq!(Positions::default().starts(slack), (vec![], vec![]));
        assert_eq!(
            Positions::default().unclaimed(),
            (vec![i32::MIN], vec![i32::MAX])
        );
        let positions = reached([(5, t), (0, u), (-1, t)]);
        assert_eq!(
            positions.starts(slack),
            (vec![5, 0, -1], vec![less(t), less(u), less(t)])
        );
        assert_eq!(
            positions.unclaimed(),
            (vec![6, 1, i32::MIN], vec![i32::MAX, 4, -2])
        );
        let edges = reached([(i32::MAX, t), (i32::MIN, u)]);
        assert_eq!(edges.unclaimed(), (vec![i32::MIN + 1], vec![i32::MAX - 1]));
    }
}
