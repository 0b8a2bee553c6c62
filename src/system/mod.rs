pub mod leases;
pub(crate) mod runtime;
pub mod stats;
pub(crate) mod workers;
