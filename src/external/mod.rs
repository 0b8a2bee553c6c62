//! External work: trackers' items imported as tasks. From the bottom up: [`workflow`] (the
//! WORKFLOW.md), the rows of sources and items (and of their workspaces,
//! [`item_workspaces`]); [`tracker`] (what the trackers share), [`github`] and [`linear`],
//! [`read`] (either tracker, by its kind); [`workspace`] (items' directories) and
//! [`import`] (one item); [`poll`] (the `poll` job) on top. [`actions`] (the approval-gated
//! writes) builds on the trackers beside them.

pub mod actions;
pub mod github;
pub mod import;
pub mod item_workspaces;
pub mod linear;
pub mod poll;
pub mod read;
mod store;
pub mod tracker;
pub mod workflow;
pub mod workspace;

pub use store::*;
