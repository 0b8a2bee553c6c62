//! Keel's domain: the resources, their fields as the API sees them, and the state machines
//! that decide every transition. No SQL and no HTTP here; `store` persists these types and
//! `api` renders them.

pub(crate) mod event;
pub(crate) mod identity;
pub(crate) mod run;

pub use event::EventType;
pub use identity::{Caller, Role, Scope};
pub use run::RunStatus;

/// Whether `name` is lower-case letters and digits in non-empty words, each joined to the
/// next by one of `separators` (an MCP server's name, a client event's kind).
pub(crate) fn is_word_name(name: &str, separators: &[char]) -> bool {
    name.split(separators).all(|word| {
        !word.is_empty()
            && word
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    })
}

/// A new, time-ordered id with a type prefix (`task_…`, `run_…`): ids sort by creation.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// Who made a state change, as the audit trail records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// A person (or a service) identified by the API: `local` in local mode, the remote
    /// identity's actor id in remote mode.
    Person(String),
    /// A worker acting on a job it holds.
    Worker(String),
    /// Keel itself: the reconciler, expiry, cascades.
    System,
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Actor::Person(id) => write!(f, "{id}"),
            Actor::Worker(id) => write!(f, "worker:{id}"),
            Actor::System => write!(f, "system"),
        }
    }
}

/// A request the domain refuses, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Invalid {
    pub(crate) field: &'static str,
    pub(crate) message: String,
}

impl Invalid {
    pub(crate) fn new(field: &'static str, message: impl Into<String>) -> Self {
        Invalid {
            field,
            message: message.into(),
        }
    }
}

/// Largest magnitude a number in free-form JSON (`compat`, a media job's `input`) may
/// have: 2^53 - 1, the range every JSON reader holds exactly. PostgreSQL keeps larger
/// numbers in full, and reading one back as a float would fail.
const MAX_JSON_NUMBER: f64 = keel_api_types::schema::MAX_JSON_NUMBER as f64;

/// Checks free-form JSON as its schema (`JsonObject`) describes it: numbers within
/// [`MAX_JSON_NUMBER`], and no NUL in a string or a key, which PostgreSQL cannot store
/// (caught here, the field named, rather than by the database).
pub(crate) fn check_free_json(
    field: &'static str,
    value: &serde_json::Value,
) -> Result<(), Invalid> {
    const NUL: &str = "holds a NUL character (\\u0000), which PostgreSQL cannot store";
    match value {
        serde_json::Value::Number(n) if n.as_f64().is_none_or(|f| f.abs() > MAX_JSON_NUMBER) => {
            Err(Invalid::new(
                field,
                format!("the number {n} is out of range (at most 2^53 - 1 in magnitude)"),
            ))
        }
        serde_json::Value::String(text) if text.contains('\0') => Err(Invalid::new(field, NUL)),
        serde_json::Value::Array(items) => items.iter().try_for_each(|v| check_free_json(field, v)),
        serde_json::Value::Object(map) => map.iter().try_for_each(|(key, v)| {
            if key.contains('\0') {
                return Err(Invalid::new(field, NUL));
            }
            check_free_json(field, v)
        }),
        _ => Ok(()),
    }
}
