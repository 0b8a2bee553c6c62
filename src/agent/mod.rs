mod job;
pub(crate) mod model_calls;
pub(crate) mod prices;
pub(crate) mod usage;

pub(crate) use job::*;
