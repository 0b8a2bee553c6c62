//! The rate limit per identity: one GCRA bucket per (workspace, actor).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::config::RateLimit;
use crate::domain::Caller;

/// Buckets of identities idle long enough to be full again are dropped this often (in
/// checks), so the map stays as large as the set of recently active identities.
const FORGET_IDLE_EVERY: u64 = 4096;

pub(crate) struct Limiter {
    buckets: DefaultKeyedRateLimiter<(String, String)>,
    clock: DefaultClock,
    checks: AtomicU64,
}

impl Limiter {
    pub(crate) fn new(rate: RateLimit) -> Limiter {
        let replenish = rate.period / rate.requests.get();
        let quota = Quota::with_period(replenish.max(Duration::from_nanos(1)))
            .expect("a non-zero period")
            .allow_burst(rate.burst);
        Limiter {
            buckets: DefaultKeyedRateLimiter::keyed(quota),
            clock: DefaultClock::default(),
            checks: AtomicU64::new(0),
        }
    }

    /// Takes one request from the caller's bucket; when it is empty, how long until it is
    /// not.
    pub(crate) fn check(&self, caller: &Caller) -> Result<(), Duration> {
        if self
            .checks
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(FORGET_IDLE_EVERY)
        {
            self.buckets.retain_recent();
        }
        self.buckets
            .check_key(&caller.identity())
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_identity_has_its_own_bucket() {
        let limiter = Limiter::new("2/m".parse().unwrap());
        let local = Caller::local();
        assert!(limiter.check(&local).is_ok());
        assert!(limiter.check(&local).is_ok());
        let wait = limiter.check(&local).unwrap_err();
        assert!(wait > Duration::from_secs(20) && wait <= Duration::from_secs(30));
        let mut other = Caller::local();
        other.actor_id = "someone".into();
        assert!(limiter.check(&other).is_ok());
    }
}
