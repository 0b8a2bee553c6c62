mod policy;
mod policy_store;
mod store;

pub use policy::*;
pub use policy_store::Policies;
pub(crate) use policy_store::{
    InForce, in_force as policy_in_force, set as set_policy, show as show_policy,
};
pub use store::*;
