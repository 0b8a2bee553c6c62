pub(crate) mod job;
mod rules;
pub(crate) mod send;
mod store;

pub(crate) use rules::{ActionDraft, ProposedAction, marked, marker};
pub(crate) use store::{
    ActionRecord, NewAction, Outcome, counts_for_source, list_for_item, lock, resolve_approval,
};
pub use store::{get, insert, update};
