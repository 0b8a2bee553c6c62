mod policy;
mod policy_store;
mod store;

pub use policy::*;
pub(crate) use policy_store::{
    in_force as policy_in_force, set as set_policy, show as show_policy,
};
pub use store::*;
