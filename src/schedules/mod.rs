//! Schedules: a task's one trigger, `once` or `cron`. This root owns their validation and
//! time computations (`rules`), their rows and occurrences (`store`) and the dispatch that
//! turns due schedules into runs (`dispatch`, in every worker). Elsewhere: the routes in
//! `api/schedules.rs`; the contract in `api-types/src/schedule.rs`.

pub mod dispatch;
mod rules;
mod store;

pub use rules::{NewSchedule, ScheduleDraft};
pub(crate) use rules::{Schedule, Trigger};
pub use store::{
    Claim, ScheduleFilter, advance, claim, delete, get, list, lock_claim, lock_due, occurrences,
    put,
};
pub(crate) use store::{
    OccurrenceRecord, Outcome, ScheduleRecord, ScheduleRecordExt, resolve, take_over_stale, writer,
};
