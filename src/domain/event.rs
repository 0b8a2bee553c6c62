//! Event types recorded in the append-only log of runs and media jobs: a closed set of
//! the wire contract.

pub use keel_api_types::EventType;
