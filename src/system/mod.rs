pub mod leases;
pub mod runtime;
pub mod stats;
pub mod workers;
