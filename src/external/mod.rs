//! External work: trackers' items imported as tasks. From the bottom up: [`workflow`] (the
//! WORKFLOW.md), the rows of sources and items (and of their workspaces,
//! [`item_workspaces`]); [`tracker`] (what the trackers share), [`github`] and [`linear`],
//! [`read`] (either tracker, by its kind); [`workspace`] (items' directories) and
//! [`import`] (one item); [`poll`] (the `poll` job) on top. [`actions`] (the approval-gated
//! writes) builds on the trackers beside them.

pub(crate) mod actions;
pub(crate) mod github;
pub(crate) mod import;
pub(crate) mod item_workspaces;
pub(crate) mod linear;
pub(crate) mod poll;
pub(crate) mod read;
mod store;
pub(crate) mod tracker;
pub(crate) mod workflow;
pub(crate) mod workspace;

pub(crate) use store::*;
