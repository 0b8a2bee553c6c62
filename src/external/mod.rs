pub mod actions;
pub mod github;
pub mod import;
pub mod item_workspaces;
pub mod linear;
pub mod poll;
mod store;
pub mod workflow;
pub mod workspace;

pub use store::*;
