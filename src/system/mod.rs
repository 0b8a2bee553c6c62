//! The runtime's own state for operators: queue leases for diagnostics (`leases`), the
//! host's identity (`runtime`), queue and worker figures (`stats`) and the worker
//! registry's upkeep (`workers`). Elsewhere: the routes in `api/system.rs` and
//! `api/runtime.rs`; the contract in `api-types/src/system.rs` and
//! `api-types/src/runtime.rs`.

pub mod leases;
pub(crate) mod runtime;
pub mod stats;
pub(crate) mod workers;
