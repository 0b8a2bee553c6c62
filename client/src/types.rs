//! The wire types: the shared contract crate (`keel-api-types`), which the server's
//! handlers use too, so the client cannot drift from the server; plus what the stream
//! carries beside the event log.

pub use keel_api_types::*;
use serde::{Deserialize, Serialize};

/// Live model text of a run's stream (`model.delta`; not persisted, so it has no id).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelDelta {
    pub model_call_index: i64,
    pub text: String,
}
