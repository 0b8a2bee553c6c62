//! Approvals: human gates on runs, as the API shows them, and the body that resolves one.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa::openapi::{RefOr, schema::Schema};

use crate::RunRecord;
use crate::schema::{Field, NO_NUL, Variant, boolean, string, tagged_union};

/// What an approval gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalKind {
    ShellCommand,
    GitExec,
    FileWrite,
    NetworkEgress,
    /// An agent loop's model asked for tool calls a policy gates (mid-run).
    AgentLoopToolCall,
    /// A write to an external tracker (a comment, labels, a review) proposed on an item.
    /// It never holds or moves the run it is attached to.
    ExternalAction,
}

impl ApprovalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalKind::ShellCommand => "shell_command",
            ApprovalKind::GitExec => "git_exec",
            ApprovalKind::FileWrite => "file_write",
            ApprovalKind::NetworkEgress => "network_egress",
            ApprovalKind::AgentLoopToolCall => "agent_loop_tool_call",
            ApprovalKind::ExternalAction => "external_action",
        }
    }
}

closed_set! {
    /// Where an approval stands. A pending approval past its `expires_at` reads as
    /// `expired`.
    ApprovalStatus {
        Pending = "pending",
        Approved = "approved",
        Rejected = "rejected",
        Cancelled = "cancelled",
        Expired = "expired",
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[schema(example = json!({
    "id": "appr_01a22b05d2aa7b6c8d9e0f1a2b3c4d5e", "task_id": "task_01a22b05c3e1734c9d7a0f2b6e41d890",
    "run_id": "run_01a22b05d1f27a6b8c9e0d1f2a3b4c5d", "kind": "shell_command", "status": "pending",
    "action_summary": ["shell: echo hello from keel"],
    "action_summary_incomplete": false, "step_id": null, "continue_on_reject": false,
    "external_action_id": null, "decision_note": null, "requested_by": "alice", "resolved_by": null,
    "created_at": "2026-11-30T09:00:05Z", "expires_at": null, "resolved_at": null
}))]
pub struct ApprovalRecord {
    pub id: String,
    pub task_id: String,
    pub run_id: String,
    #[schema(value_type = ApprovalKind)]
    pub kind: String,
    /// `pending`, `approved`, `rejected`, `cancelled`, or `expired` (a pending approval
    /// past its `expires_at` reads as expired).
    pub status: ApprovalStatus,
    pub action_summary: Vec<String>,
    pub action_summary_incomplete: bool,
    /// `agent_loop_tool_call` only: the `model_call` step whose tool calls it covers.
    pub step_id: Option<String>,
    /// Rejected with `continue`: the model got a refusal as each call's result and the
    /// run went on.
    pub continue_on_reject: bool,
    /// `external_action` only: the action it gates (`GET /v1/external-work/actions/{id}`).
    pub external_action_id: Option<String>,
    pub decision_note: Option<String>,
    /// Who requested what it gates: its run's requester, or the proposer of an external
    /// action (null for approvals from before requesters were recorded). In remote mode
    /// they cannot resolve it unless `KEEL_ALLOW_SELF_APPROVAL` is set.
    pub requested_by: Option<String>,
    pub resolved_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub resolved_at: Option<DateTime<Utc>>,
}

/// The body of `POST …/approvals/{approval_id}/resolve`. The fields are optional here so
/// the server can name the one at fault; the document states the contract, a union on
/// `decision`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    /// `approve` or `reject` (required).
    pub decision: Option<String>,
    /// Why; kept on the approval (at most 4096 bytes).
    pub note: Option<String>,
    /// With `reject`, on an `agent_loop_tool_call` approval only: the model reads a refusal
    /// as each gated call's result and the run goes on instead of being cancelled.
    #[serde(rename = "continue")]
    pub continue_on_reject: Option<bool>,
}

/// Longest decision note (bytes).
const MAX_NOTE_BYTES: usize = 4096;

hand_written_schema!(ResolveRequest, resolve_union);

fn resolve_union(schemas: &mut Vec<(String, RefOr<Schema>)>) -> RefOr<Schema> {
    let note = || -> Field {
        let note = string(true, NO_NUL, Some(MAX_NOTE_BYTES));
        (
            "note",
            false,
            note.description(Some("Why; kept on the approval (at most 4096 bytes)."))
                .into(),
        )
    };
    let continues = boolean(true).description(Some(
        "On an `agent_loop_tool_call` approval only (400 on another kind): the model reads \
         a refusal as each gated call's result and the run goes on instead of being \
         cancelled.",
    ));
    tagged_union(
        "decision",
        "A decision on a pending approval.",
        vec![
            Variant {
                tag: "approve",
                name: "ApproveRequest",
                description: "Approve: the last approved gate queues the run (only a \
                              rejection can `continue`).",
                fields: vec![note()],
                rules: Vec::new(),
            },
            Variant {
                tag: "reject",
                name: "RejectRequest",
                description: "Reject: the run is cancelled, unless it continues.",
                fields: vec![note(), ("continue", false, continues.into())],
                rules: Vec::new(),
            },
        ],
        schemas,
    )
}

/// A decision's result: the approval and the run it gated.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Resolution {
    pub approval: ApprovalRecord,
    pub run: RunRecord,
}
