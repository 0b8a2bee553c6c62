//! Pruning: the worker registry forgets workers that stopped heartbeating, ended leases
//! older than a week leave the lease history, and with a history retention
//! (`KEEL_HISTORY_RETENTION_DAYS`) events and state transitions older than it go.

use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};

use crate::db::Result;
use crate::events;
use crate::system;

/// One pass: workers silent for ten maintenance intervals (at least a minute) and lease
/// history past its keep.
pub(super) async fn pass(pool: &PgPool, interval: Duration) {
    let stale_ms = (interval.as_millis() as i64 * 10).max(60_000);
    if let Err(error) = system::workers::prune(pool, stale_ms).await {
        tracing::warn!(%error, "worker registry pruning failed");
    }
    if let Err(error) = prune_lease_history(pool).await {
        tracing::warn!(%error, "lease history pruning failed");
    }
}

/// Ended leases are kept this long for diagnostics.
const LEASE_HISTORY_DAYS: i32 = 7;

async fn prune_lease_history(pool: &PgPool) -> Result<u64> {
    crate::system::leases::prune(&mut *pool.acquire().await?, LEASE_HISTORY_DAYS).await
}

/// Rows a history retention batch reads: one statement each, short enough that the rows
/// it deletes are locked briefly.
const HISTORY_BATCH: i64 = 5_000;
/// Batches per table per pass: a backlog (a retention just turned on) is worked through
/// over several ticks rather than in one long pass.
const HISTORY_BATCHES_PER_PASS: usize = 20;
/// Once a table is caught up, the next look at it: retention is counted in days.
const HISTORY_CAUGHT_UP_PAUSE: Duration = Duration::from_secs(3600);

/// History retention: where the walk of each table stands (ids grow with time, so each
/// walks from the oldest row; a worker that restarts walks again from the start, past
/// the rows kept), and when to look again.
pub(super) struct HistoryRetention {
    days: i32,
    walks: [Walk; 2],
    next: Instant,
}

impl HistoryRetention {
    /// None without a retention (0 days: history is kept for ever).
    pub(super) fn new(days: u32) -> Option<HistoryRetention> {
        (days > 0).then(|| HistoryRetention {
            days: i32::try_from(days).unwrap_or(i32::MAX),
            walks: [
                Walk::from_start(History::Events),
                Walk::from_start(History::Transitions),
            ],
            next: Instant::now(),
        })
    }

    pub(super) async fn pass(&mut self, pool: &PgPool) {
        if Instant::now() < self.next {
            return;
        }
        match self.prune(pool).await {
            Ok((deleted, caught_up)) => {
                if deleted > 0 {
                    tracing::info!(
                        deleted,
                        days = self.days,
                        "history retention removed old events and transitions"
                    );
                }
                if caught_up {
                    self.next = Instant::now() + HISTORY_CAUGHT_UP_PAUSE;
                }
            }
            Err(error) => tracing::warn!(%error, "history retention failed"),
        }
    }

    /// Rows deleted, and whether both tables are caught up.
    async fn prune(&mut self, pool: &PgPool) -> Result<(i64, bool)> {
        let mut conn = pool.acquire().await?;
        let (mut deleted, mut caught_up) = (0, true);
        for walk in &mut self.walks {
            let (rows, done) = walk.advance(&mut conn, self.days).await?;
            deleted += rows;
            caught_up &= done;
        }
        Ok((deleted, caught_up))
    }
}

/// The tables history retention walks.
#[derive(Clone, Copy)]
enum History {
    Events,
    Transitions,
}

/// One table's walk: the greatest id it has examined.
struct Walk {
    table: History,
    after: i64,
}

impl Walk {
    fn from_start(table: History) -> Walk {
        Walk { table, after: 0 }
    }

    /// Up to [`HISTORY_BATCHES_PER_PASS`] batches on from where the walk stands; rows
    /// deleted, and whether it reached rows too young to go.
    async fn advance(&mut self, conn: &mut PgConnection, days: i32) -> Result<(i64, bool)> {
        let mut deleted = 0;
        for _ in 0..HISTORY_BATCHES_PER_PASS {
            let pruned = match self.table {
                History::Events => events::prune(conn, self.after, days, HISTORY_BATCH).await?,
                History::Transitions => {
                    events::transitions::prune(conn, self.after, days, HISTORY_BATCH).await?
                }
            };
            deleted += pruned.deleted;
            match pruned.last {
                Some(last) => self.after = last,
                None => return Ok((deleted, true)),
            }
        }
        Ok((deleted, false))
    }
}
