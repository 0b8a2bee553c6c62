//! The sweep: the full claim, run off the claim loop and spaced out while positioned claims
//! are on, for what they miss (expired leases, enqueues that committed late).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Claiming, HeldSnapshot, catch_all_pause};
use crate::queue::Lease;

/// How long the sweep waits between full claims that take `cost`: they run at most
/// 1/[`super::CATCH_ALL_SPACING`] of the time, at least a poll interval and at most
/// [`MAX_SWEEP_PAUSE`] apart.
fn sweep_pause(cost: Duration, poll_interval: Duration) -> Duration {
    catch_all_pause(cost)
        .min(MAX_SWEEP_PAUSE)
        .max(poll_interval)
}

/// The longest a job that only a full claim finds (an enqueue that committed late) waits
/// while positioned claims are on.
const MAX_SWEEP_PAUSE: Duration = Duration::from_secs(60);

/// The full claim while an old snapshot is held, off the claim loop so positioned claims
/// go on (a slow full claim in the loop would hold up every pickup behind it), spaced by
/// [`sweep_pause`]. It hands what it claimed to the loop. Idle otherwise (the loop runs
/// full claims itself).
pub(super) async fn sweep(
    claiming: Claiming,
    state: Arc<HeldSnapshot>,
    found: mpsc::UnboundedSender<(Vec<Lease>, tokio::time::Instant)>,
    stop: CancellationToken,
) {
    loop {
        let cost = Duration::from_micros(state.full_claim_us.load(Ordering::Relaxed));
        let pause = sweep_pause(cost, claiming.poll_interval);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        if !state.is_held() {
            continue;
        }
        // Even a saturated worker sweeps: what only a full claim finds would otherwise
        // wait for a free slot at a sweep, which positioned claims may never leave. Jobs
        // swept beyond the free slots wait, leased, for one (as prefetched jobs do).
        let room = state.room.load(Ordering::Relaxed).max(claiming.concurrency);
        let started = Instant::now();
        let Claiming {
            pool,
            owner,
            kinds,
            lease,
            ..
        } = &claiming;
        match crate::queue::claim(pool, owner, kinds, room as i64, *lease).await {
            Ok(leases) => {
                state.record_full_claim(started);
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
