mod job;
pub mod model_calls;
pub mod prices;
pub mod usage;

pub use job::*;
