//! The reconciler's window: its scans for expired leases read those that expired since the
//! previous pass, so they do not step over the entries of every job settled since the
//! oldest snapshot still held; a pass from the head, which also finds a lease a windowed
//! pass skipped while its row was locked, runs whenever it is cheap and otherwise at most
//! 1/[`super::CATCH_ALL_SPACING`] of the time.

use std::time::Instant;

use chrono::{DateTime, TimeDelta, Utc};

use super::catch_all_pause;

/// How far before the previous pass a windowed pass starts reading, for leases whose
/// expiry committed just after that pass read.
const OVERLAP: TimeDelta = TimeDelta::seconds(1);

#[derive(Debug)]
pub(crate) struct ExpiredWindow {
    /// Where the next windowed pass starts (the database's clock at the last pass).
    since: Option<DateTime<Utc>>,
    next_full: Instant,
}

impl Default for ExpiredWindow {
    fn default() -> Self {
        ExpiredWindow {
            since: None,
            next_full: Instant::now(),
        }
    }
}

/// One pass's read: whether it starts from the head, and from which expiry otherwise.
pub(crate) struct Scan {
    full: bool,
    pub(crate) from: Option<DateTime<Utc>>,
    started: Instant,
}

impl ExpiredWindow {
    /// The next pass's read.
    pub(crate) fn scan(&self) -> Scan {
        let started = Instant::now();
        let full = started >= self.next_full;
        let from = self.since.filter(|_| !full).map(|t| t - OVERLAP);
        Scan {
            full,
            from,
            started,
        }
    }

    /// Records a pass that read at `read_at` (the database's clock) and found all there
    /// was (a full batch may have left more in its window: it is read again next time).
    pub(crate) fn read(&mut self, scan: Scan, read_at: DateTime<Utc>, all: bool) {
        if all {
            self.since = Some(read_at);
        }
        if scan.full {
            self.next_full = Instant::now() + catch_all_pause(scan.started.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_pass_reads_from_the_last_one_less_the_overlap_and_from_the_head_when_due() {
        let mut window = ExpiredWindow::default();
        let first = window.scan();
        assert!(first.full, "the first pass reads from the head");
        let at = Utc::now();
        window.read(first, at, true);
        window.next_full = Instant::now() + Duration::from_secs(60);
        let windowed = window.scan();
        assert_eq!(windowed.from, Some(at - OVERLAP));
        window.read(windowed, at + TimeDelta::seconds(5), false);
        assert_eq!(
            window.scan().from,
            Some(at - OVERLAP),
            "a full batch is read again"
        );
        window.next_full = Instant::now();
        assert_eq!(window.scan().from, None, "a due pass reads from the head");
    }
}
