//! Tasks: the body that creates one, the task as the API shows it, and its status.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::RunStatus;

/// The body of `POST /v1/tasks`, as the client sent it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "execution_kind": "shell", "shell_command": "echo hello from keel",
    "timeout_ms": 60000, "priority": 5, "budget_micros_usd": 2000000
}))]
pub struct TaskDraft {
    pub execution_kind: Option<String>,
    pub prompt: Option<String>,
    pub shell_command: Option<String>,
    pub git_command: Option<String>,
    pub file_path: Option<String>,
    pub file_content: Option<String>,
    pub file_operation: Option<String>,
    pub working_directory: Option<String>,
    pub workspace_mode: Option<String>,
    /// For `in_place`: a directory beneath `KEEL_WORKSPACE_ROOTS` that the working
    /// directory must lie beneath, narrowing the operator's roots for this task.
    pub sandbox_allowed_root: Option<String>,
    /// Whether shell and git children may use the network (default true); false runs them
    /// in a network namespace with only loopback.
    pub sandbox_network: Option<bool>,
    /// Whether the workspace is read-only for the run (default false): shell and git children
    /// see it mounted read-only, and file writes are refused.
    pub sandbox_read_only: Option<bool>,
    pub timeout_ms: Option<i64>,
    pub priority: Option<i32>,
    pub budget_micros_usd: Option<i64>,
    /// For `agent_loop`: the system prompt the conversation starts with.
    pub system_prompt: Option<String>,
    /// For `agent_loop`: a provider preset id; absent: the workspace's first enabled chat
    /// preset.
    pub requested_provider: Option<String>,
    /// For `agent_loop`: the model to ask for, instead of the preset's.
    pub requested_model: Option<String>,
    /// For `agent_loop`: the most model calls across the run's resume chain (> 0).
    pub max_model_calls: Option<i32>,
    /// For `agent_loop`: the tools the model may call (a subset of the catalog); absent:
    /// the whole catalog the sandbox allows.
    pub tools: Option<Vec<String>>,
}

/// A task as the API shows it, with its latest run's projection.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[schema(example = json!({
    "id": "task_01a22b05c3e1734c9d7a0f2b6e41d890", "execution_kind": "shell", "status": "completed",
    "prompt": null, "shell_command": "echo hello from keel", "git_command": null,
    "file_path": null, "file_content": null, "file_operation": null,
    "working_directory": null, "workspace_mode": "ephemeral", "sandbox_allowed_root": null, "sandbox_network": true, "sandbox_read_only": false, "timeout_ms": 60000, "priority": 5, "budget_micros_usd": 2000000,
    "system_prompt": null, "requested_provider": null, "requested_model": null,
    "max_model_calls": null, "tools": null, "run_count": 1,
    "latest_run_id": "run_01a22b05d1f27a6b8c9e0d1f2a3b4c5d", "latest_run_step_count": 1,
    "latest_run_artifact_count": 2, "created_at": "2026-11-30T09:00:00Z",
    "updated_at": "2026-11-30T09:01:12Z"
}))]
pub struct TaskRecord {
    pub id: String,
    pub execution_kind: String,
    pub status: String,
    pub prompt: Option<String>,
    pub shell_command: Option<String>,
    pub git_command: Option<String>,
    pub file_path: Option<String>,
    pub file_content: Option<String>,
    pub file_operation: Option<String>,
    pub working_directory: Option<String>,
    pub workspace_mode: String,
    /// For `in_place`: the directory the task narrows the workspace roots to.
    pub sandbox_allowed_root: Option<String>,
    /// False: shell and git children run with only loopback, and need no `network_egress`.
    pub sandbox_network: bool,
    /// True: the workspace is read-only for shell and git children; file writes are refused.
    pub sandbox_read_only: bool,
    pub timeout_ms: Option<i64>,
    pub priority: i32,
    pub budget_micros_usd: i64,
    /// `agent_loop` only (null otherwise): the system prompt.
    pub system_prompt: Option<String>,
    /// `agent_loop` only: the provider preset id asked for (null: the workspace's first
    /// enabled chat preset).
    pub requested_provider: Option<String>,
    /// `agent_loop` only: the model asked for (null: the preset's).
    pub requested_model: Option<String>,
    /// `agent_loop` only: the most model calls across the resume chain.
    pub max_model_calls: Option<i32>,
    /// `agent_loop` only: the tools the model may call (null: the whole catalog the sandbox
    /// allows).
    pub tools: Option<Vec<String>>,
    pub run_count: i32,
    pub latest_run_id: Option<String>,
    pub latest_run_step_count: i64,
    pub latest_run_artifact_count: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl TaskRecord {
    /// Whether the task is an agent loop; every other kind runs a process.
    pub fn is_agent_loop(&self) -> bool {
        self.execution_kind == ExecutionKind::AgentLoop.as_str()
    }
}

/// What a task runs: a shell command, git arguments, a file operation, or an agent loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionKind {
    Shell,
    Git,
    File,
    AgentLoop,
}

impl ExecutionKind {
    pub const ALL: [ExecutionKind; 4] = [
        ExecutionKind::Shell,
        ExecutionKind::Git,
        ExecutionKind::File,
        ExecutionKind::AgentLoop,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionKind::Shell => "shell",
            ExecutionKind::Git => "git",
            ExecutionKind::File => "file",
            ExecutionKind::AgentLoop => "agent_loop",
        }
    }

    pub fn parse(value: &str) -> Option<ExecutionKind> {
        ExecutionKind::ALL.into_iter().find(|k| k.as_str() == value)
    }
}

/// Optional body of start, retry and resume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "reason": "nightly check", "budget_micros_usd": 5000000 }))]
pub struct StartRequest {
    /// Why, for the run's `run.created` event.
    pub reason: Option<String>,
    /// Raises the task's budget (never lowers it); micro-USD, not negative.
    #[schema(minimum = 0)]
    pub budget_micros_usd: Option<i64>,
}

/// A task's status: `not_started` until its first run, then its latest run's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    NotStarted,
    Queued,
    Running,
    AwaitingApproval,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub fn parse(value: &str) -> Option<TaskStatus> {
        match value {
            "not_started" => Some(TaskStatus::NotStarted),
            other => RunStatus::parse(other).map(TaskStatus::from),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::NotStarted => "not_started",
            TaskStatus::Queued => "queued",
            TaskStatus::Running => "running",
            TaskStatus::AwaitingApproval => "awaiting_approval",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }
}

/// A started task's status is its latest run's.
impl From<RunStatus> for TaskStatus {
    fn from(status: RunStatus) -> Self {
        match status {
            RunStatus::Queued => TaskStatus::Queued,
            RunStatus::Running => TaskStatus::Running,
            RunStatus::AwaitingApproval => TaskStatus::AwaitingApproval,
            RunStatus::Completed => TaskStatus::Completed,
            RunStatus::Failed => TaskStatus::Failed,
            RunStatus::Cancelled => TaskStatus::Cancelled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_status_names_round_trip() {
        assert_eq!(
            TaskStatus::parse("not_started"),
            Some(TaskStatus::NotStarted)
        );
        assert_eq!(TaskStatus::parse("running"), Some(TaskStatus::Running));
        assert_eq!(TaskStatus::parse("bogus"), None);
        for status in RunStatus::ALL {
            assert_eq!(TaskStatus::from(status).as_str(), status.as_str());
        }
    }

    #[test]
    fn execution_kind_names_round_trip() {
        for kind in ExecutionKind::ALL {
            assert_eq!(ExecutionKind::parse(kind.as_str()), Some(kind));
        }
    }
}
