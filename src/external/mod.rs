//! External work: trackers' items imported as tasks. From the bottom up: the rows of
//! sources and items (and of their workspaces, [`item_workspaces`]); [`tracker`] (the
//! contract every tracker implements, and what it takes and gives: a workflow's tracker
//! settings, an action's calls and answers); [`github`] and [`linear`]; [`workflow`] (the
//! WORKFLOW.md, parsed with each kind's defaults and checks); [`workspace`] (items'
//! directories) and [`import`] (one item); [`poll`] (the `poll` job) on top. [`actions`]
//! (the approval-gated writes) has its rules and rows beneath the trackers, and its
//! requests and job above them.
//!
//! The seam between Keel and a tracker is [`tracker::TrackerApi`]: [`github`] and
//! [`linear`] each implement all of it (the workflow's defaults for it, its candidates
//! fetched and read, the items asked for again, an action's calls made and its marked
//! writes found), and [`TrackerKind::api`](tracker::TrackerKind::api), given in
//! [`workflow`] above them, is the one place that maps a workflow's `tracker.kind` to its
//! implementation. Nothing else asks which kind a tracker is.

pub(crate) mod actions;
pub(crate) mod github;
pub(crate) mod import;
pub(crate) mod item_workspaces;
pub(crate) mod linear;
pub(crate) mod poll;
mod store;
pub(crate) mod tracker;
pub(crate) mod triage;
pub(crate) mod workflow;
pub(crate) mod workspace;

pub(crate) use store::{
    FailedClaim, ItemChange, ItemFilter, ItemRecord, NewItem, PollRecord, SourceRecord,
    WorkflowOrigin, active_runs, claimed_to_reconcile, claimed_version, claimed_with_failed_runs,
    delete_source, get_item, get_source, insert_item, insert_source, item_by_key, item_counts,
    item_record, list_items, list_sources, lock_slots, lock_subject, previous_key, query_items,
    record_poll, refresh_issue, registrant, registrant_role, set_background, update_item,
    waiting_for_slots, workflow_last_good,
};
