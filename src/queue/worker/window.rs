//! How many jobs a worker holds at once: its slots plus a prefetch that widens while claims
//! are what the worker waits on, and narrows back when they are not.
//!
//! A worker far from its database finishes short jobs faster than a claim travels: with a
//! fixed prefetch its slots sit idle between claims (docs/benchmarks.md, "Remote database").
//! So after a claim that filled all its room while a slot sat free with nothing waiting
//! at some moment of its round trip, the prefetch doubles, up to [`GROWTH`] times the configured one; after a claim
//! that came back short (the queue had no more), it halves back towards the configured one.
//! A prefetch of 0 stays 0: a worker told to claim only for free slots never holds more.

/// The most the prefetch grows to, as a multiple of the configured one.
pub(super) const GROWTH: usize = 4;

#[derive(Debug, Clone)]
pub(super) struct Window {
    concurrency: usize,
    configured: usize,
    prefetch: usize,
}

impl Window {
    pub(super) fn new(concurrency: usize, prefetch: usize) -> Self {
        Window {
            concurrency,
            configured: prefetch,
            prefetch,
        }
    }

    /// Jobs the worker may hold: running, waiting for a slot, or with acks pending.
    pub(super) fn size(&self) -> usize {
        self.concurrency + self.prefetch
    }

    pub(super) fn prefetch(&self) -> usize {
        self.prefetch
    }

    /// After a claim came back: `full`, it filled the room it was given; `starved`, a slot
    /// was free with no job waiting for it while the claim travelled.
    pub(super) fn claimed(&mut self, full: bool, starved: bool) {
        if full && starved {
            self.prefetch = (self.prefetch * 2).min(self.configured * GROWTH);
        } else if !full {
            self.prefetch = (self.prefetch / 2).max(self.configured);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefetch_widens_while_claims_starve_the_slots_and_narrows_when_they_come_back_short() {
        let mut window = Window::new(16, 500);
        assert_eq!(window.size(), 516);
        window.claimed(true, false);
        assert_eq!(window.prefetch(), 500, "full but no slot waited: no growth");
        window.claimed(true, true);
        window.claimed(true, true);
        window.claimed(true, true);
        assert_eq!(window.prefetch(), 500 * GROWTH, "capped");
        window.claimed(false, true);
        assert_eq!(window.prefetch(), 1000);
        window.claimed(false, false);
        window.claimed(false, false);
        assert_eq!(
            window.prefetch(),
            500,
            "never below the configured prefetch"
        );
    }

    #[test]
    fn a_worker_without_a_prefetch_never_holds_more_than_its_slots() {
        let mut window = Window::new(8, 0);
        window.claimed(true, true);
        window.claimed(true, true);
        assert_eq!(window.size(), 8);
    }
}
