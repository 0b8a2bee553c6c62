//! Job handlers, one per queue kind: they connect the generic queue to the domain.

pub mod run;
