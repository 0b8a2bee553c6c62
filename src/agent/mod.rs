mod job;
mod mcp;
pub(crate) mod model_calls;
pub(crate) mod prices;
mod store;
pub(crate) mod usage;

pub(crate) use job::*;
