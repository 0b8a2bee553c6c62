//! How the worker claims: full claims while no old snapshot is held, positioned claims
//! and a spaced-out sweep while one is, and the watch on the oldest snapshot's age that
//! switches between them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::queue::QueueError;
use crate::queue::worker::WorkerSettings;
use crate::queue::{Lease, Positions, QueuePool};

/// A snapshot held this long means vacuum is leaving dead index entries at the head of the
/// claim order: positioned claims go on. Longer than any transaction Keel itself keeps
/// open (an enqueue that commits late included), shorter than the seconds after which a
/// busy queue's full claims step over thousands of entries.
const OLD_SNAPSHOT: Duration = Duration::from_secs(2);

/// How often a worker looks at the age of the oldest snapshot.
const SNAPSHOT_CHECK: Duration = Duration::from_secs(1);

/// How long the sweep waits between full claims that take `cost`: they run at most
/// 1/[`crate::queue::CATCH_ALL_SPACING`] of the time, at least a poll interval and at most
/// [`MAX_SWEEP_PAUSE`] apart.
fn sweep_pause(cost: Duration, poll_interval: Duration) -> Duration {
    crate::queue::catch_all_pause(cost)
        .min(MAX_SWEEP_PAUSE)
        .max(poll_interval)
}

/// The longest a job that only a full claim finds (an enqueue that committed late) waits
/// while positioned claims are on.
const MAX_SWEEP_PAUSE: Duration = Duration::from_secs(60);

/// What the claim loop, its sweep and the snapshot watch share.
#[derive(Default)]
pub(super) struct ClaimState {
    /// How long the last full claim took (µs).
    full_claim_us: AtomicU64,
    /// Whether an old snapshot is held: positioned claims are on.
    old_snapshot: AtomicBool,
    /// Jobs the worker can take now.
    pub(super) room: AtomicUsize,
}

impl ClaimState {
    fn record(&self, started: Instant) {
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.full_claim_us.store(us, Ordering::Relaxed);
    }

    fn positioned(&self) -> bool {
        self.old_snapshot.load(Ordering::Relaxed)
    }
}

/// Turns positioned claims on while the oldest snapshot is older than [`OLD_SNAPSHOT`]
/// and off once it is not, looking every [`SNAPSHOT_CHECK`], off the claim path. The
/// cause is watched, not a symptom: a claim's latency also grows with the distance to the
/// database, and a worker 1 ms away from it read slow claims as an old snapshot.
pub(super) async fn watch_snapshots(
    pool: QueuePool,
    state: Arc<ClaimState>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(SNAPSHOT_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match crate::queue::oldest_snapshot(&pool).await {
            Ok(age) => {
                let old = age >= OLD_SNAPSHOT;
                if state.old_snapshot.swap(old, Ordering::Relaxed) != old {
                    tracing::info!(
                        ?age,
                        "oldest snapshot {}; positioned claims {}",
                        if old { "old" } else { "recent" },
                        if old { "on" } else { "off" }
                    );
                }
            }
            Err(error) => tracing::warn!(%error, "could not read the oldest snapshot's age"),
        }
    }
}

/// How the claim loop claims (docs/queue.md, "Old snapshots"). While no old snapshot is
/// held, each claim is one full claim ([`crate::queue::claim`]: due jobs from
/// the head of the index, and expired leases). While one is ([`watch_snapshots`]), the
/// loop claims each kind from where its claims have reached ([`crate::queue::claim_from`]) and
/// [`sweep`] runs the full claim, spaced out, off the loop.
#[derive(Default)]
pub(super) struct Claimer {
    positions: Mutex<HashMap<String, Positions>>,
    pub(super) shared: Arc<ClaimState>,
}

impl Claimer {
    pub(super) async fn claim(
        &self,
        pool: &QueuePool,
        owner: &str,
        kinds: &[String],
        room: usize,
        settings: &WorkerSettings,
    ) -> Result<Vec<Lease>, QueueError> {
        if let Some(max) = settings.max_per_workspace {
            return Self::claim_fair(pool, owner, kinds, room, settings.timing.lease, max).await;
        }
        let leases = if self.shared.positioned() {
            self.claim_from(pool, owner, kinds, room, settings).await?
        } else {
            let started = Instant::now();
            let leases =
                crate::queue::claim(pool, owner, kinds, room as i64, settings.timing.lease).await?;
            self.shared.record(started);
            leases
        };
        self.advance(&leases);
        Ok(leases)
    }

    /// Fair claims have no positions to keep: each workspace is read from the head of its
    /// own stretch of the index.
    async fn claim_fair(
        pool: &QueuePool,
        owner: &str,
        kinds: &[String],
        room: usize,
        lease: Duration,
        max: u32,
    ) -> Result<Vec<Lease>, QueueError> {
        kind_by_kind(kinds, room, |kind, limit| {
            crate::queue::fair::claim(pool.pool(), owner, kind, limit, lease, max)
        })
        .await
    }

    async fn claim_from(
        &self,
        pool: &QueuePool,
        owner: &str,
        kinds: &[String],
        room: usize,
        settings: &WorkerSettings,
    ) -> Result<Vec<Lease>, QueueError> {
        kind_by_kind(kinds, room, |kind, limit| {
            let (from, slack) = {
                let mut positions = self.positions.lock().unwrap();
                let from = positions.entry(kind.to_string()).or_default();
                let slack = from.slack();
                (from.clone(), slack)
            };
            async move {
                crate::queue::claim_from(
                    pool,
                    owner,
                    kind,
                    &from,
                    slack,
                    limit,
                    settings.timing.lease,
                )
                .await
            }
        })
        .await
    }

    /// Moves each kind's positions up to these jobs.
    pub(super) fn advance(&self, leases: &[Lease]) {
        let mut positions = self.positions.lock().unwrap();
        for lease in leases {
            positions
                .entry(lease.kind.clone())
                .or_default()
                .advance(lease);
        }
    }
}

/// Claims kind by kind, each for what room the kinds before it left, until the room is
/// filled: `claim(kind, limit)` claims up to `limit` jobs of one kind.
async fn kind_by_kind<'k, F, Claim>(
    kinds: &'k [String],
    room: usize,
    mut claim: F,
) -> Result<Vec<Lease>, QueueError>
where
    F: FnMut(&'k str, i64) -> Claim,
    Claim: Future<Output = Result<Vec<Lease>, QueueError>>,
{
    let mut leases = Vec::new();
    for kind in kinds {
        let left = room.saturating_sub(leases.len());
        if left == 0 {
            break;
        }
        leases.extend(claim(kind, left as i64).await?);
    }
    Ok(leases)
}

/// The full claim while an old snapshot is held, off the claim loop so positioned claims
/// go on (a slow full claim in the loop would hold up every pickup behind it), spaced by
/// [`sweep_pause`]. It hands what it claimed to the loop. Idle otherwise (the loop runs
/// full claims itself).
pub(super) async fn sweep(
    pool: QueuePool,
    owner: String,
    kinds: Vec<String>,
    settings: WorkerSettings,
    state: Arc<ClaimState>,
    found: mpsc::UnboundedSender<(Vec<Lease>, tokio::time::Instant)>,
    stop: CancellationToken,
) {
    loop {
        let cost = Duration::from_micros(state.full_claim_us.load(Ordering::Relaxed));
        let pause = sweep_pause(cost, settings.poll_interval);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        if !state.positioned() {
            continue;
        }
        // Even a saturated worker sweeps: what only a full claim finds would otherwise
        // wait for a free slot at a sweep, which positioned claims may never leave. Jobs
        // swept beyond the free slots wait, leased, for one (as prefetched jobs do).
        let room = state.room.load(Ordering::Relaxed).max(settings.concurrency);
        let started = Instant::now();
        match crate::queue::claim(&pool, &owner, &kinds, room as i64, settings.timing.lease).await {
            Ok(leases) => {
                state.record(started);
                if !leases.is_empty() && found.send((leases, started.into())).is_err() {
                    return;
                }
            }
            Err(error) => tracing::warn!(%error, "sweep claim failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_are_spaced_by_their_cost_within_bounds() {
        let poll = Duration::from_millis(100);
        assert_eq!(sweep_pause(Duration::from_micros(10), poll), poll);
        assert_eq!(
            sweep_pause(Duration::from_millis(50), poll),
            Duration::from_secs(1)
        );
        // A full claim that took 10 s would be spaced 200 s apart without the bound.
        assert_eq!(sweep_pause(Duration::from_secs(10), poll), MAX_SWEEP_PAUSE);
        assert_eq!(
            sweep_pause(Duration::from_millis(500), poll),
            Duration::from_secs(10)
        );
    }
}
