//! Tracker actions: a comment, labels or a review an item's run proposes, sent only once
//! an operator approved it and only while its target is as it was. This folder owns the
//! proposal's rules (`rules`), its row (`store`), how its calls are sent and a marked write
//! found again (`send`, above the trackers) and the `external_action` job (`job`). The
//! approval itself is an `approvals` row; its routes are in `api/external_work.rs`.

pub(crate) mod job;
mod rules;
pub(crate) mod send;
mod store;

pub(crate) use rules::{ActionDraft, ProposedAction, marked, marker};
pub(crate) use store::{
    ActionRecord, NewAction, Outcome, counts_for_source, list_for_item, lock, resolve_approval,
};
pub use store::{get, insert, update};
