//! Job handlers, one per queue kind: they connect the generic queue to the domain.

mod fence;
pub mod media;
pub mod run;
