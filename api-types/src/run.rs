//! The run state machine: `queued → running → completed | failed | cancelled`, with
//! `awaiting_approval` before `queued` when a gate stops a run, and `running →
//! awaiting_approval → queued` when an agent loop's tool calls wait for one mid-run.
//! [`RunStatus::can_become`] is the one place that decides which transitions exist; the
//! store guards every status update with the states it allows.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
// A text column; an unknown value is a decode error, never a panic.
#[cfg_attr(feature = "sqlx", derive(sqlx::Type))]
#[cfg_attr(feature = "sqlx", sqlx(type_name = "text", rename_all = "snake_case"))]
pub enum RunStatus {
    Queued,
    Running,
    AwaitingApproval,
    Completed,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::AwaitingApproval,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::AwaitingApproval => "awaiting_approval",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(value: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|s| s.as_str() == value)
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }

    /// Whether a run in this state may move to `next`.
    pub fn can_become(self, next: RunStatus) -> bool {
        use RunStatus::*;
        match (self, next) {
            (AwaitingApproval, Queued | Cancelled) => true,
            (Queued, Running | Cancelled | Failed) => true,
            // Running → Queued: the lease was lost and the run waits for another worker.
            (Running, Queued | Completed | Failed | Cancelled) => true,
            // An agent loop's model asked for gated tool calls: the run waits, leaseless.
            (Running, AwaitingApproval) => true,
            _ => false,
        }
    }

    /// Every state from which `next` may be reached: the guard of a status update.
    pub fn sources_of(next: RunStatus) -> Vec<&'static str> {
        RunStatus::ALL
            .into_iter()
            .filter(|s| s.can_become(next))
            .map(RunStatus::as_str)
            .collect()
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[schema(example = json!({
    "id": "run_01a22b05d1f27a6b8c9e0d1f2a3b4c5d", "task_id": "task_01a22b05c3e1734c9d7a0f2b6e41d890",
    "number": 1, "status": "completed", "attempt": 1,
    "worker_id": "wrk_01a22b04aa0e7c5d9f3b2a1c0d9e8f7a", "exit_code": 0, "last_error": null,
    "retried_from_run_id": null, "resumed_from_run_id": null, "checkpoint": null,
    "prior_cost_micros_usd": 0, "total_cost_micros_usd": 0, "model_call_count": 0,
    "abandoned_model_calls": 0,
    "model": null, "provider": null, "lineage_kind": null, "from_model_call_index": null,
    "answer": null, "terminal_code": "completed", "schedule_id": null,
    "schedule_occurrence_id": null, "scheduled_for": null, "requested_by": "local",
    "created_at": "2026-11-30T09:00:05Z", "started_at": "2026-11-30T09:00:05Z",
    "finished_at": "2026-11-30T09:01:12Z", "updated_at": "2026-11-30T09:01:12Z"
}))]
pub struct RunRecord {
    pub id: String,
    pub task_id: String,
    pub number: i32,
    pub status: RunStatus,
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub exit_code: Option<i32>,
    pub last_error: Option<String>,
    pub retried_from_run_id: Option<String>,
    pub resumed_from_run_id: Option<String>,
    /// For a resumed run: where it picks up (source run, last completed step, last event).
    pub checkpoint: Option<serde_json::Value>,
    pub prior_cost_micros_usd: i64,
    pub total_cost_micros_usd: i64,
    /// Agent loops: the model calls this run completed, and the model and provider preset
    /// of the latest (null before the first).
    pub model_call_count: i32,
    /// Agent loops: model calls an attempt started and never recorded (it was stopped at its
    /// lease's local deadline or killed while the call was in flight). The provider may have
    /// billed them; the next attempt repeats each one.
    pub abandoned_model_calls: i32,
    pub model: Option<String>,
    pub provider: Option<String>,
    /// How the run came from `resumed_from_run_id`: `resume`, `continue` or
    /// `retry_from_model_call` (null for a start or a retry).
    #[schema(value_type = Option<LineageKind>)]
    pub lineage_kind: Option<String>,
    /// For `retry_from_model_call`: the source run's 1-based model call this run re-issues.
    pub from_model_call_index: Option<i32>,
    /// An agent loop run that completed: the model's answer (the text of its last message,
    /// which asked for no tool call). Null for other kinds, and until the run completes.
    pub answer: Option<String>,
    /// Why the run ended (`last_error` says it in words); null until it ends, and for runs
    /// that ended before codes were kept.
    pub terminal_code: Option<TerminalCode>,
    /// The conversation an agent loop run starts from; null: the task's prompts. Not
    /// rendered (it can be large): read the source's `agent_conversation` artifact.
    #[serde(skip)]
    pub conversation_base: Option<serde_json::Value>,
    /// The run whose ephemeral workspace this run uses (itself unless resumed).
    #[serde(skip)]
    pub workspace_run_id: Option<String>,
    /// Set on runs a schedule created.
    pub schedule_id: Option<String>,
    pub schedule_occurrence_id: Option<String>,
    /// The schedule's nominal fire time (UTC); may precede `started_at` after downtime.
    pub scheduled_for: Option<DateTime<Utc>>,
    /// Who asked for the run: the actor id that started, retried or resumed it (`local` in
    /// local mode), `system` for scheduled and imported runs; null for runs from before
    /// requesters were recorded. In remote mode this actor cannot resolve the run's
    /// approvals unless `KEEL_ALLOW_SELF_APPROVAL` is set.
    pub requested_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

impl RunRecord {
    pub fn status(&self) -> RunStatus {
        self.status
    }

    /// The run whose ephemeral workspace directory this run works in.
    pub fn workspace_owner(&self) -> &str {
        self.workspace_run_id.as_deref().unwrap_or(&self.id)
    }
}

/// One step of a run: what its executor did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct StepRecord {
    pub id: String,
    pub run_id: String,
    pub task_id: String,
    pub index: i32,
    pub name: String,
    pub status: StepStatus,
    pub input: serde_json::Value,
    pub output: Option<serde_json::Value>,
    pub error: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

closed_set! {
    /// Why an ended run ended, for a program to branch on (`last_error` says it in words).
    TerminalCode {
        Completed = "completed",
        /// Cancelled by a person, the API or its external work item.
        Cancelled = "cancelled",
        /// Cancelled because an approval it waited on was rejected.
        ApprovalRejected = "approval_rejected",
        /// Its process exited with a code other than 0.
        ExitedNonzero = "exited_nonzero",
        /// Its process was killed by a signal.
        Killed = "killed",
        /// It reached its `timeout_ms`.
        TimedOut = "timed_out",
        /// Its processes reached the run's process or memory limit.
        ResourceLimit = "resource_limit",
        /// The worker could not give it the sandbox it asks for.
        SandboxUnavailable = "sandbox_unavailable",
        /// Its workspace could not be prepared (refused, unavailable, its clone failed).
        WorkspaceFailed = "workspace_failed",
        /// A workflow hook around it failed.
        HookFailed = "hook_failed",
        /// Its changes could not be pushed.
        PushFailed = "push_failed",
        /// The model could not be called (the provider refused or stayed unavailable, or
        /// no model is configured).
        ModelError = "model_error",
        /// It reached its task's `budget_micros_usd`.
        BudgetExceeded = "budget_exceeded",
        /// It reached its task's `max_model_calls`.
        MaxModelCallsReached = "max_model_calls_reached",
        /// Its client stopped appending within its lease, or held it the longest it may.
        ClientLeaseLapsed = "client_lease_lapsed",
        /// Its attempts ran out (each worker lost it or failed to run it).
        GaveUp = "gave_up",
        /// Another failure: `last_error` says which.
        Failed = "failed",
    }
}

/// `last_error`'s beginnings that name a [`TerminalCode`], first match wins: the prefixes
/// the runtime's failures start with.
const ERROR_PREFIXES: [(&str, TerminalCode); 21] = [
    ("process exited with code", TerminalCode::ExitedNonzero),
    ("process was killed by a signal", TerminalCode::Killed),
    ("timed out after", TerminalCode::TimedOut),
    ("timeout:", TerminalCode::TimedOut),
    ("pids_limit_reached:", TerminalCode::ResourceLimit),
    ("memory_limit_exceeded:", TerminalCode::ResourceLimit),
    ("sandbox_unavailable:", TerminalCode::SandboxUnavailable),
    ("workspace_unavailable:", TerminalCode::WorkspaceFailed),
    ("workspace_refused:", TerminalCode::WorkspaceFailed),
    ("clone_failed:", TerminalCode::WorkspaceFailed),
    ("hook_failed:", TerminalCode::HookFailed),
    ("push_failed:", TerminalCode::PushFailed),
    ("provider_error:", TerminalCode::ModelError),
    ("provider_unavailable:", TerminalCode::ModelError),
    ("provider_disabled:", TerminalCode::ModelError),
    ("model_not_configured:", TerminalCode::ModelError),
    ("budget_exceeded:", TerminalCode::BudgetExceeded),
    (
        "max_model_calls_reached:",
        TerminalCode::MaxModelCallsReached,
    ),
    ("client_lease_expired:", TerminalCode::ClientLeaseLapsed),
    ("client_lease_max_reached:", TerminalCode::ClientLeaseLapsed),
    ("gave up after", TerminalCode::GaveUp),
];

impl TerminalCode {
    /// The code of a run that ends in `status` with `last_error`; None while it has not
    /// ended. The one place that reads a failure's words as a code.
    pub fn of(status: RunStatus, last_error: Option<&str>) -> Option<TerminalCode> {
        let error = last_error.unwrap_or_default();
        match status {
            RunStatus::Completed => Some(TerminalCode::Completed),
            RunStatus::Cancelled if error == "approval rejected" => {
                Some(TerminalCode::ApprovalRejected)
            }
            RunStatus::Cancelled => Some(TerminalCode::Cancelled),
            RunStatus::Failed => Some(
                ERROR_PREFIXES
                    .iter()
                    .find(|(prefix, _)| error.starts_with(prefix))
                    .map_or(TerminalCode::Failed, |(_, code)| *code),
            ),
            RunStatus::Queued | RunStatus::Running | RunStatus::AwaitingApproval => None,
        }
    }
}

closed_set! {
    /// How a run carries on from the run it was resumed from.
    LineageKind {
        Resume = "resume",
        Continue = "continue",
        RetryFromModelCall = "retry_from_model_call",
    }
}

closed_set! {
    /// A step's state: `running` until its executor ends it.
    StepStatus {
        Running = "running",
        Completed = "completed",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

closed_set! {
    /// What an artifact holds: a run's output streams and files, a media job's results, an
    /// agent loop's patches and conversation.
    ArtifactKind {
        Stdout = "stdout",
        Stderr = "stderr",
        File = "file",
        Image = "image",
        Video = "video",
        Metadata = "metadata",
        Patch = "patch",
        AgentConversation = "agent_conversation",
    }
}

closed_set! {
    /// `writing` while its producer may still append to it, `complete` after.
    ArtifactStatus {
        Writing = "writing",
        Complete = "complete",
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct ArtifactRecord {
    pub id: String,
    /// The run that wrote it and its task (null for a media job's artifact).
    pub run_id: Option<String>,
    pub task_id: Option<String>,
    /// The media job that produced it (null for a run's artifact).
    pub media_job_id: Option<String>,
    pub name: String,
    pub kind: ArtifactKind,
    pub content_type: String,
    pub size_bytes: i64,
    pub truncated: bool,
    pub status: ArtifactStatus,
    pub storage: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::RunStatus::{self, *};
    use super::{ERROR_PREFIXES, TerminalCode};

    /// Failures as the runtime words them, each with the code it reads as.
    #[test]
    fn an_ended_runs_code_is_read_from_its_status_and_error() {
        let cases = [
            (Completed, None, TerminalCode::Completed),
            (
                Cancelled,
                Some("cancelled by request"),
                TerminalCode::Cancelled,
            ),
            (
                Cancelled,
                Some("approval rejected"),
                TerminalCode::ApprovalRejected,
            ),
            (
                Failed,
                Some("process exited with code 3: disk is full"),
                TerminalCode::ExitedNonzero,
            ),
            (
                Failed,
                Some("process was killed by a signal"),
                TerminalCode::Killed,
            ),
            (
                Failed,
                Some("timed out after 300 ms"),
                TerminalCode::TimedOut,
            ),
            (
                Failed,
                Some("timeout: the run reached its timeout_ms"),
                TerminalCode::TimedOut,
            ),
            (
                Failed,
                Some("pids_limit_reached: 18 new processes refused; process exited with code 2"),
                TerminalCode::ResourceLimit,
            ),
            (
                Failed,
                Some("clone_failed: fatal: repository not found"),
                TerminalCode::WorkspaceFailed,
            ),
            (
                Failed,
                Some("provider_unavailable: 503 from the provider"),
                TerminalCode::ModelError,
            ),
            (
                Failed,
                Some("gave up after 5 attempts"),
                TerminalCode::GaveUp,
            ),
            (Failed, Some("the client's own words"), TerminalCode::Failed),
            (Failed, None, TerminalCode::Failed),
        ];
        for (status, error, code) in cases {
            assert_eq!(
                TerminalCode::of(status, error),
                Some(code),
                "{status:?} {error:?}"
            );
        }
        for status in [Queued, Running, AwaitingApproval] {
            assert_eq!(TerminalCode::of(status, Some("timeout: x")), None);
        }
        // No prefix hides a later one.
        for (i, (prefix, _)) in ERROR_PREFIXES.iter().enumerate() {
            for (earlier, _) in &ERROR_PREFIXES[..i] {
                assert!(!prefix.starts_with(earlier), "{earlier} hides {prefix}");
            }
        }
    }

    #[test]
    fn terminal_states_are_final() {
        for from in [Completed, Failed, Cancelled] {
            for to in RunStatus::ALL {
                assert!(!from.can_become(to), "{from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn lifecycle_transitions() {
        assert!(Queued.can_become(Running));
        assert!(Running.can_become(Completed));
        assert!(Running.can_become(Queued));
        assert!(AwaitingApproval.can_become(Queued));
        // Mid-loop: an agent run waits for a tool-call approval, then is queued again.
        assert!(Running.can_become(AwaitingApproval));
        assert!(!Queued.can_become(AwaitingApproval));
        assert!(!Queued.can_become(Completed));
        assert!(!AwaitingApproval.can_become(Running));
        assert_eq!(
            RunStatus::sources_of(Cancelled),
            ["queued", "running", "awaiting_approval"]
        );
    }

    #[test]
    fn names_round_trip() {
        for status in RunStatus::ALL {
            assert_eq!(RunStatus::parse(status.as_str()), Some(status));
        }
    }
}
