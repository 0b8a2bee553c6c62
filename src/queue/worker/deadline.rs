//! Self-fencing: the local deadline of every held lease, and the watch that stops a job
//! once its deadline passes. Fencing keeps a stale worker's writes out of the database;
//! only the worker itself can keep its processes, model calls and POSTs from outliving
//! its lease. Another worker claims a job once its lease expired on the database's clock,
//! which a worker cut off from the database cannot read. So each worker keeps its own
//! bound: the moment it sent the last statement the database confirmed for the lease (the
//! claim or a renewal), plus the lease, minus a margin (docs/queue.md, "Self-fencing").
//! The database ran that statement after it was sent, so its expiry lies beyond.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::queue::worker::Registry;
use crate::telemetry;

/// How a worker times its leases: validated once, at start-up ([`LeaseTiming::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// The lease the database grants at each claim and renewal.
    pub(crate) lease: Duration,
    /// Taken off the lease for the local deadline: the time a kill takes, the watch's
    /// lateness and the clocks' rate drift.
    pub(crate) margin: Duration,
    /// The longest a heartbeat may take before it is abandoned.
    pub(crate) heartbeat_timeout: Duration,
}

impl LeaseTiming {
    /// Refuses timings under which a healthy worker would stop its own jobs or another
    /// worker could take a job over while this one still runs it.
    pub(crate) fn new(
        lease: Duration,
        margin: Duration,
        heartbeat_timeout: Duration,
    ) -> Result<LeaseTiming, String> {
        let ms = |d: Duration| d.as_millis();
        if heartbeat_timeout.is_zero() || lease < heartbeat_timeout * 3 {
            return Err(format!(
                "the lease ({} ms) must be at least three heartbeat timeouts ({} ms each): a \
                 heartbeat runs every lease/3 and must end before the next one is due",
                ms(lease),
                ms(heartbeat_timeout)
            ));
        }
        if margin.is_zero() || margin >= lease {
            return Err(format!(
                "the lease margin ({} ms) must be more than 0 and less than the lease ({} ms)",
                ms(margin),
                ms(lease)
            ));
        }
        // Renewed at the start of a heartbeat, a lease must outlast the next heartbeat and
        // its timeout, or a worker whose database answers would still stop its jobs.
        if lease - margin <= lease / 3 + heartbeat_timeout {
            return Err(format!(
                "the lease margin ({} ms) leaves less than one heartbeat interval and timeout \
                 ({} ms) of the lease ({} ms): jobs would stop between healthy heartbeats",
                ms(margin),
                ms(lease / 3 + heartbeat_timeout),
                ms(lease)
            ));
        }
        Ok(LeaseTiming {
            lease,
            margin,
            heartbeat_timeout,
        })
    }

    /// The default for a lease: a tenth of it as the margin, a fifth as the heartbeat
    /// timeout.
    pub fn for_lease(lease: Duration) -> LeaseTiming {
        LeaseTiming {
            lease,
            margin: lease / 10,
            heartbeat_timeout: lease / 5,
        }
    }

    /// The heartbeat interval.
    pub(crate) fn interval(&self) -> Duration {
        self.lease / 3
    }

    /// The local deadline of a lease the database confirmed for a statement sent at `sent`.
    pub(super) fn deadline(&self, sent: Instant) -> Instant {
        sent + self.lease - self.margin
    }
}

/// A job's view of its lease's local deadline.
#[derive(Clone, Debug)]
pub struct LeaseDeadline {
    at: watch::Receiver<Instant>,
    /// Asks the heartbeat for a renewal now.
    renew: Arc<Notify>,
    /// How far ahead the deadline must be for a new external effect: one heartbeat
    /// interval, which a healthy worker always keeps.
    headroom: Duration,
}

/// The deadline is too near for a new external effect and no renewal moved it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lease's local deadline is too near for a new external call")]
pub struct DeadlineNear;

impl LeaseDeadline {
    pub(super) fn new(
        at: watch::Receiver<Instant>,
        renew: Arc<Notify>,
        timing: &LeaseTiming,
    ) -> Self {
        LeaseDeadline {
            at,
            renew,
            headroom: timing.interval(),
        }
    }

    /// What is left until the job must stop.
    pub(crate) fn remaining(&self) -> Duration {
        self.at.borrow().saturating_duration_since(Instant::now())
    }

    /// Ok while the deadline is at least a heartbeat interval ahead. Nearer (a heartbeat
    /// was missed), it asks for a renewal at once and waits for one until the deadline;
    /// `DeadlineNear` when none came: the caller must not start its call.
    pub(crate) async fn ensure_ahead(&self) -> Result<(), DeadlineNear> {
        if self.remaining() >= self.headroom {
            return Ok(());
        }
        let mut at = self.at.clone();
        self.renew.notify_one();
        let ahead = |at: &Instant| at.saturating_duration_since(Instant::now()) >= self.headroom;
        match tokio::time::timeout(self.remaining(), at.wait_for(ahead)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(DeadlineNear),
        }
    }
}

/// Stops every held job whose local deadline passed: its interrupt fires (the handler
/// kills its processes and abandons its calls) and it is renewed no more. Wakes at the
/// earliest deadline, and at least every `every` for jobs claimed meanwhile.
pub(super) async fn self_fence(registry: Registry, every: Duration, stop: CancellationToken) {
    loop {
        let now = Instant::now();
        let earliest = stop_passed(&registry, now);
        let wake = earliest.map_or(now + every, |at| at.min(now + every));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Interrupts the jobs whose deadline is at or before `now`; returns the earliest deadline
/// of the others.
fn stop_passed(registry: &Registry, now: Instant) -> Option<Instant> {
    let mut registry = registry.lock().unwrap();
    let mut earliest: Option<Instant> = None;
    for (job_id, job) in registry.iter_mut().filter(|(_, job)| !job.past_deadline) {
        let at = *job.deadline.borrow();
        if at <= now {
            tracing::warn!(
                job_id,
                kind = %job.kind,
                late_ms = now.duration_since(at).as_millis() as u64,
                "lease lost locally: its deadline passed without a confirmed renewal; stopping the job"
            );
            telemetry::metrics::lease_lost(&job.kind);
            job.past_deadline = true;
            job.interrupt.cancel();
        } else {
            earliest = Some(earliest.map_or(at, |e| e.min(at)));
        }
    }
    earliest
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn timings_that_would_overlap_or_starve_are_refused() {
        assert!(LeaseTiming::new(S(3000), S(300), S(500)).is_ok());
        let short = LeaseTiming::new(S(3000), S(300), S(1001)).unwrap_err();
        assert!(short.contains("three heartbeat timeouts"), "{short}");
        let wide = LeaseTiming::new(S(3000), S(3000), S(500)).unwrap_err();
        assert!(wide.contains("less than the lease"), "{wide}");
        assert!(LeaseTiming::new(S(3000), S(0), S(500)).is_err());
        // 3000 - 1600 leaves less than 1000 + 500.
        let tight = LeaseTiming::new(S(3000), S(1600), S(500)).unwrap_err();
        assert!(tight.contains("heartbeat interval"), "{tight}");
        let defaults = LeaseTiming::for_lease(S(30_000));
        assert_eq!(
            LeaseTiming::new(defaults.lease, defaults.margin, defaults.heartbeat_timeout),
            Ok(defaults)
        );
    }

    #[tokio::test]
    async fn a_near_deadline_asks_for_a_renewal_and_refuses_without_one() {
        let timing = LeaseTiming::for_lease(S(300));
        let (tx, rx) = watch::channel(Instant::now() + S(20));
        let renew = Arc::new(Notify::new());
        let deadline = LeaseDeadline::new(rx, renew.clone(), &timing);
        assert_eq!(deadline.ensure_ahead().await, Err(DeadlineNear));
        // Near but not passed: a renewal that lands while the job waits lets it go on.
        tx.send_replace(Instant::now() + S(60));
        let renewer = tokio::spawn(async move {
            renew.notified().await;
            tx.send_replace(Instant::now() + S(270));
            tx
        });
        assert_eq!(deadline.ensure_ahead().await, Ok(()));
        let _tx = renewer.await.unwrap();
        assert!(deadline.remaining() > S(100));
    }
}
