//! Runs: an execution of a task, from admission to its end. This root owns the run's row
//! and its transitions (`store`), how a run comes to be (`admission`: the one-active-run
//! guard, approval gates, lineage, budget, idempotency), its gates' decisions (`gates`),
//! steps, patches, client-orchestrated runs (`client`), workspace retention and the `run`
//! job's attempt (`job`, which hands an `agent_loop` run to [`crate::agent`]).
//! Elsewhere: the routes in `api/admission.rs`, `api/client_runs.rs`, `api/patches.rs`
//! and `api/lineage.rs`; the contract in `api-types/src/run.rs`; the processes a run
//! starts in `workers/` (`process.rs`, `file.rs`, `sandbox/`).

#[macro_use]
mod records;
mod admission;
pub(crate) mod client;
pub(crate) mod gates;
pub(crate) mod job;
pub(crate) mod lineage;
pub mod patches;
mod projection;
pub(crate) mod retention;
pub mod steps;
mod store;

pub use admission::{Admission, AdmissionRules, Admitted, Orchestrator, Origin, admit};
pub(crate) use admission::{ScheduleProvenance, admit_locked};
pub use gates::resolve_gate;
pub use projection::{heartbeat, state};
pub use store::{
    Change, RunFilter, RunRecord, cancel, get, get_by_id, list, list_in_workspace, transition,
};
pub(crate) use store::{
    Move, RunWithTask, active_page, cancel_because, close_open_work, keep_conversation_base, lock,
    lock_with_task, priority_of, read_with_task, requeue_lost, transition_fenced,
    transition_locked, transition_recorded,
};
