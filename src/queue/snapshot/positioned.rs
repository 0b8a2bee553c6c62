//! Positioned claims: while an old snapshot is held, a worker reads each kind from where its
//! claims have reached instead of from the head of claim order, where the entries of every
//! job claimed since the snapshot lie.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::queue::{Lease, QueuePool, Result, millis, query_leases};

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

/// Enqueues that commit this long after their `run_after` was set (their transaction's
/// start) are found by the next [`claim_from`].
pub const COMMIT_SLACK: Duration = Duration::from_millis(25);

/// Enqueues that commit up to this long after their `run_after` are found by a
/// [`claim_from`] within [`WIDE_READ_EVERY`]; later ones wait for a full [`claim`].
pub const LATE_COMMIT_SLACK: Duration = Duration::from_millis(500);

/// How often a worker's positioned claims of a kind read [`LATE_COMMIT_SLACK`] behind its
/// positions. Everything in that stretch has been claimed but for the rare late commit,
/// and while an old snapshot is held each claimed job still has its entry there, which
/// the read steps over with a heap visit: read so on every claim, that stretch is most of
/// the database's work.
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
    let leases = query_leases!(
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
         ),",
        "FROM leased ORDER BY priority DESC, run_after, job_id",
        owner,
        millis(lease),
        kind,
        limit,
        &priorities,
        &starts,
        &lowest,
        &highest,
    )
    .fetch_all(&pool.0)
    .await?;
    Ok(leases)
}

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
