//! Keel's domain: the resources, their fields as the API sees them, and the state machines
//! that decide every transition. No SQL and no HTTP here; `store` persists these types and
//! `api` renders them.

pub mod approval;
pub mod event;
pub mod media;
pub mod provider;
pub mod run;
pub mod schedule;
pub mod secret;
pub mod task;

pub use event::EventType;
pub use run::RunStatus;
pub use task::{NewTask, TaskStatus};

/// A new, time-ordered id with a type prefix (`task_…`, `run_…`): ids sort by creation.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// Who made a state change, as the audit trail records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// A request to the HTTP API.
    Api,
    /// A worker acting on a job it holds.
    Worker(String),
    /// Keel itself: the reconciler, expiry, cascades.
    System,
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Actor::Api => write!(f, "api"),
            Actor::Worker(id) => write!(f, "worker:{id}"),
            Actor::System => write!(f, "system"),
        }
    }
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
