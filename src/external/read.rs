//! A source's tracker, whichever its kind: an item normalized (from a poll's list or a
//! manual import's payload) and the current version of given items fetched, each handed
//! to [`github`] or [`linear`].

use keel_workers::media::Secret;
use serde_json::Value;

use crate::external::ItemRecord;
use crate::external::tracker::{Candidate, Fetched, Poller};
use crate::external::workflow::{Tracker, TrackerKind};
use crate::external::{github, linear};

/// The item of a manual import's payload: a webhook payload or the item itself, as the
/// tracker's API has it.
pub(crate) fn payload_candidate(tracker: &Tracker, payload: &Value) -> Result<Candidate, String> {
    match tracker.kind {
        TrackerKind::Github => github::payload_candidate(tracker, payload),
        TrackerKind::Linear => linear::payload_candidate(tracker, payload),
    }
}

/// A polled item of the tracker, normalized.
pub(crate) fn polled_candidate(tracker: &Tracker, value: &Value) -> Result<Candidate, String> {
    match tracker.kind {
        TrackerKind::Github => github::candidate(tracker, value),
        TrackerKind::Linear => linear::candidate(tracker, value),
    }
}

/// The current version of each of these items, whatever their state, from the tracker.
pub(crate) async fn fetch_items(
    poller: &Poller,
    tracker: &Tracker,
    token: Option<&Secret>,
    items: &[&ItemRecord],
) -> Fetched {
    match tracker.kind {
        TrackerKind::Github => github::fetch_items(poller, tracker, token, items).await,
        TrackerKind::Linear => linear::fetch_items(poller, tracker, token, items).await,
    }
}
