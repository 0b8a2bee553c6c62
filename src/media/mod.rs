//! Media jobs: image and video generation. This root owns their validation (`rules`),
//! their row and transitions (`store`) and the `media` job's attempt (`job`). Elsewhere:
//! the routes in `api/media_jobs.rs`; the contract in `api-types/src/media.rs`; the
//! vendors' protocols in `workers/src/media/`.

pub(crate) mod job;
mod rules;
mod store;

pub(crate) use rules::{MediaJobStatus, check_runnable, parse_operation};
pub use rules::{Operation, Unrunnable, Vendor};
pub use store::{
    Change, ListFilter, NewMediaJob, Refused, cancel, create, get, list, run, transition,
};
pub(crate) use store::{MediaJobRecord, lock, requeue_lost, save_vendor_task};
