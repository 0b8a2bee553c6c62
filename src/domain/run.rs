//! The run state machine: `queued → running → completed | failed | cancelled`, with
//! `awaiting_approval` before `queued` when a gate stops a run, and `running →
//! awaiting_approval → queued` when an agent loop's tool calls wait for one mid-run.
//! [`RunStatus::can_become`] is the one place that decides which transitions exist; the
//! store guards every status update with the states it allows. The enum and its rules
//! live in the wire contract (`keel-api-types`), so clients read the same states.

pub use keel_api_types::RunStatus;
