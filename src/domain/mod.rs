//! Keel's domain: the resources, their fields as the API sees them, and the state machines
//! that decide every transition. No SQL and no HTTP here; `store` persists these types and
//! `api` renders them.

pub mod event;
pub mod run;
pub mod schedule;
pub mod task;

pub use event::EventType;
pub use run::RunStatus;
pub use task::{NewTask, TaskStatus};

/// A new, time-ordered id with a type prefix (`task_…`, `run_…`): ids sort by creation.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// A request the domain refuses, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Invalid {
    pub field: &'static str,
    pub message: String,
}

impl Invalid {
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        Invalid {
            field,
            message: message.into(),
        }
    }
}
