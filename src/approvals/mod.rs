//! Approvals: human gates on runs and on external actions. This root owns the policy that
//! decides which gates a run needs (`policy`), the workspace's policy in force
//! (`policy_store`) and the approval rows (`store`). A run's gates are decided in
//! [`crate::runs`] (`gates`), an external action's in [`crate::external`].
//! Elsewhere: the routes in `api/approvals.rs`; the contract in
//! `api-types/src/approval.rs` and `api-types/src/policy.rs`.

mod policy;
mod policy_store;
mod store;

pub use policy::{ActionSummary, ApprovalPolicy, Decision};
pub(crate) use policy::{ApprovalKind, DEFAULT_POLICIES, Runs, redact};
pub use policy_store::Policies;
pub(crate) use policy_store::{
    InForce, in_force as policy_in_force, set as set_policy, show as show_policy,
};
pub use store::{ApprovalFilter, Approver, Gate, OLDEST_FIRST, create, decidable, get, list};
pub(crate) use store::{
    ApprovalRecord, cancel_pending, check_approver, create_for_action, lock_pending, pending_count,
    requested_data, requested_event, resolved_event, settle_decided, settled_status,
};
