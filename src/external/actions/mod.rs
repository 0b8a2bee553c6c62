//! Tracker actions: a comment, labels, a review or a pull request an item's run proposes,
//! sent only once an operator approved and executed it, and only while its target is as
//! it was. This folder owns the
//! proposal's rules (`rules`), its row (`store`), how its calls are sent and a marked write
//! found again (`send`, above the trackers) and the `external_action` job (`job`). The
//! approval itself is an `approvals` row; its routes are in `api/external_work.rs`.

pub(crate) mod job;
mod rules;
pub(crate) mod send;
mod store;

pub(crate) use rules::{ActionDraft, ProposedAction, Step, Unbranched, marked, marker};
pub(crate) use store::{
    ActionFilter, ActionRecord, NewAction, Outcome, cancel, counts_for_source, execute, list, lock,
    resolve_approval,
};
pub use store::{get, insert, update};
