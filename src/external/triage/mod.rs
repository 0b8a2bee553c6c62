//! CI triage (seed 000 §Triage GitHub CI): a pull request item's failing checks, read by a
//! `ci_triage` worker job with GitHub `GET`s only (`checks`), each recorded once per head
//! with its evidence and a fix task (`store`, `job`), whose run is started from the record
//! with a deterministic idempotency key. The routes are in `api/external_work.rs`.

mod checks;
pub(crate) mod job;
mod store;

pub(crate) use job::{TriageJobs, request_scan, start_fix_run};
pub(crate) use store::{RecordFilter, get_record, get_scan, list_records};
