//! Claims: the full claim (due jobs from the head of claim order, and expired leases), the
//! positioned claim a worker uses while an old snapshot is held, the ordered-reads
//! settings both rely on, and the age of the oldest snapshot that decides between them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::queue::Result;
use crate::queue::{Lease, QueuePool, millis};

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
    pub(crate) fn slack(&mut self) -> Duration {
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
             SELECT archive_leases(array_agg(q), array_agg('expired'::text))
             FROM queue_jobs q
             WHERE q.id IN (SELECT id FROM expired) AND q.id IN (SELECT id FROM picked)
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
         SELECT leased.* FROM leased, ended ORDER BY priority DESC, run_after, job_id",
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

/// A catch-all read (a full claim, a scan for expired leases from the head of the index)
/// that took `cost` runs again only after this long, so it takes at most
/// 1/[`CATCH_ALL_SPACING`] of the time however slow an old snapshot makes it.
pub fn catch_all_pause(cost: Duration) -> Duration {
    cost * CATCH_ALL_SPACING
}

pub const CATCH_ALL_SPACING: u32 = 20;

#[cfg(test)]
mod tests {
    use super::*;

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
