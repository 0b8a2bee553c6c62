//! Claiming while an old snapshot is held (docs/queue.md, "Old snapshots"). While any
//! transaction keeps an old snapshot, vacuum removes no dead index entry, and a read from
//! the head of claim order steps over the entry of every job claimed since. Everything the
//! queue does about it is here, behind [`HeldSnapshot`], which the worker's claimer asks
//! whether to claim by position:
//! - the watch on the oldest snapshot's age, which turns positioned claims on and off
//!   ([`watch`]);
//! - positioned claims: each kind read from where its claims have reached
//!   ([`positioned`]);
//! - the sweep: the full claim, spaced out, for what positioned claims miss ([`sweep`]);
//! - the reconciler's window: expired leases read from where its last pass was
//!   ([`window`]).

mod positioned;
mod sweep;
mod watch;
mod window;

pub use positioned::{COMMIT_SLACK, LATE_COMMIT_SLACK, Positions, WIDE_READ_EVERY, claim_from};
pub(crate) use window::ExpiredWindow;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::queue::{Lease, QueuePool, Result};

/// A catch-all read (a full claim, a scan for expired leases from the head of the index)
/// that took `cost` runs again only after this long, so it takes at most
/// 1/[`CATCH_ALL_SPACING`] of the time however slow an old snapshot makes it.
fn catch_all_pause(cost: Duration) -> Duration {
    cost * CATCH_ALL_SPACING
}

const CATCH_ALL_SPACING: u32 = 20;

/// What a worker's claims are made of: its queue connections, its name, its kinds, its
/// lease, and what its sweep needs.
#[derive(Clone)]
pub(crate) struct Claiming {
    pub(crate) pool: QueuePool,
    pub(crate) owner: String,
    pub(crate) kinds: Vec<String>,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) concurrency: usize,
}

/// What a worker's claims share about old snapshots: whether one is held, how long its last
/// full claim took, the room it has, and where each kind's claims have reached.
#[derive(Default)]
pub(crate) struct HeldSnapshot {
    held: AtomicBool,
    /// How long the last full claim took (µs).
    full_claim_us: AtomicU64,
    /// Jobs the worker can take now.
    room: AtomicUsize,
    positions: Mutex<HashMap<String, Positions>>,
}

/// Jobs the sweep claimed, and when its claim was sent.
pub(crate) type Swept = mpsc::UnboundedReceiver<(Vec<Lease>, tokio::time::Instant)>;

impl HeldSnapshot {
    /// Starts the watch and the sweep of a worker, until `stop` fires; what the sweep
    /// claims arrives on the receiver.
    pub(crate) fn start(claiming: Claiming, stop: CancellationToken) -> (Arc<HeldSnapshot>, Swept) {
        let state = Arc::new(HeldSnapshot::default());
        let (found, swept) = mpsc::unbounded_channel();
        tokio::spawn(watch::watch(
            claiming.pool.clone(),
            state.clone(),
            stop.clone(),
        ));
        tokio::spawn(sweep::sweep(claiming, state.clone(), found, stop));
        (state, swept)
    }

    /// Whether an old snapshot is held: claims go by position.
    pub(crate) fn is_held(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }

    /// The room the worker has now, which the sweep claims for.
    pub(crate) fn set_room(&self, room: usize) {
        self.room.store(room, Ordering::Relaxed);
    }

    /// How long a full claim started at `started` took: the sweep spaces itself by it.
    pub(crate) fn record_full_claim(&self, started: Instant) {
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.full_claim_us.store(us, Ordering::Relaxed);
    }

    /// Claims up to `limit` jobs of `kind` from where this worker's claims of it reached.
    pub(crate) async fn claim(
        &self,
        claiming: &Claiming,
        kind: &str,
        limit: i64,
    ) -> Result<Vec<Lease>> {
        let (from, slack) = {
            let mut positions = self.positions.lock().unwrap();
            let from = positions.entry(kind.to_string()).or_default();
            let slack = from.slack();
            (from.clone(), slack)
        };
        let (pool, owner, lease) = (&claiming.pool, &claiming.owner, claiming.lease);
        claim_from(pool, owner, kind, &from, slack, limit, lease).await
    }

    /// Moves each kind's positions up to these jobs.
    pub(crate) fn advance(&self, leases: &[Lease]) {
        let mut positions = self.positions.lock().unwrap();
        for lease in leases {
            positions
                .entry(lease.kind.clone())
                .or_default()
                .advance(lease);
        }
    }
}
