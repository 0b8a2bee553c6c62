//! An agent loop run read as a conversation (seed 003's transcript contract, in Keel's
//! snake_case): one turn per run, its blocks in order: the prompt, the model's text of each
//! call, each tool call with its arguments and an abridged result, the approvals that held
//! the run, the file changes its tools made. Built from the persisted steps, approvals and
//! patches, so every read (after a takeover too) says the same; ids are the records' own.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

closed_set! {
    /// A turn's lifecycle: the run's status in the contract's words.
    TurnStatus {
        Open = "open",
        Running = "running",
        WaitingForApproval = "waiting_for_approval",
        Succeeded = "succeeded",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

closed_set! {
    /// A block's lifecycle.
    BlockStatus {
        Running = "running",
        WaitingForApproval = "waiting_for_approval",
        Blocked = "blocked",
        Succeeded = "succeeded",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

closed_set! {
    /// What a block shows.
    BlockKind {
        /// The prompt the run started from (`text`).
        UserMessage = "user_message",
        /// One model call: its text (`text`, maybe empty when it only called tools) and
        /// its figures (`model_call`).
        CoordinatorText = "coordinator_text",
        /// One tool call (`tool`).
        OperationCell = "operation_cell",
        /// An approval the run waited on (`approval`).
        Approval = "approval",
        /// A file a tool changed or proposed to change (`file_change`).
        FileChange = "file_change",
        /// A pointer to what the transcript does not repeat (`raw_detail_ref`): the run a
        /// resumed one carries on.
        RawDetailRef = "raw_detail_ref",
    }
}

closed_set! {
    /// What a tool call does, from its tool's name (`other` for an MCP server's tools).
    OperationKind {
        Read = "read",
        Edit = "edit",
        RunCommand = "run_command",
        Search = "search",
        Other = "other",
    }
}

/// A run's transcript.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunTranscript {
    /// 1: the contract's version.
    pub schema_version: u32,
    pub task_id: String,
    pub run_id: String,
    /// The run's answer (`RunRecord.answer`) once it completed.
    pub answer: Option<String>,
    /// The run's last event this read reflects: the run's stream after it carries on
    /// from here.
    pub sequence: i64,
    pub generated_at: DateTime<Utc>,
    pub turns: Vec<TranscriptTurn>,
}

/// One turn: a run, from its prompt to its end.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TranscriptTurn {
    /// The run's id.
    pub id: String,
    pub status: TurnStatus,
    pub blocks: Vec<TranscriptBlock>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One block of a turn; `kind` says which of the optional parts it carries.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TranscriptBlock {
    /// Stable across reads: the step's, approval's or patch's id (`prompt` for the prompt).
    pub id: String,
    pub kind: BlockKind,
    pub status: Option<BlockStatus>,
    /// `user_message` and `coordinator_text`: the words, whole (Markdown, to be rendered
    /// as text, never as markup).
    pub text: Option<String>,
    pub model_call: Option<ModelCallFacts>,
    pub tool: Option<ToolFacts>,
    pub approval: Option<ApprovalFacts>,
    pub file_change: Option<FileChangeFacts>,
    /// Where the whole record is: `workflow_step` (a step id), `approval`, `artifact`,
    /// or `run`.
    pub raw_detail_ref: Option<RawDetailRef>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One model call's figures.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelCallFacts {
    /// The call's 1-based index in the run's lineage.
    pub index: i64,
    pub model: Option<String>,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    /// Null when the model has no price: unknown, not free.
    pub cost_micros_usd: Option<i64>,
    /// From the step's start to its end; null while it runs.
    pub latency_ms: Option<i64>,
    /// The tool calls it asked for, by name.
    pub tool_calls: Vec<String>,
}

/// One tool call: what was asked and an abridged answer (the step has them whole).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ToolFacts {
    pub name: String,
    /// The MCP server for `mcp__SERVER__TOOL` names.
    pub server: Option<String>,
    pub operation_kind: OperationKind,
    pub arguments: String,
    pub result: Option<String>,
    pub is_error: bool,
    /// Whether `arguments` or `result` was cut to the inline limit.
    pub abridged: bool,
    pub latency_ms: Option<i64>,
}

/// An approval the run waited on, and the command that decides it while it is pending.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApprovalFacts {
    pub approval_id: String,
    /// `pending`, `approved`, `rejected`, `cancelled` or `expired`.
    pub status: String,
    pub action_summary: Vec<String>,
    pub resolved_by: Option<String>,
    pub decision_note: Option<String>,
    /// While pending: `keel approvals approve ID` (or `reject`).
    pub decide_with: Option<String>,
}

/// A file change a tool made (`applied`) or proposed (`proposed`), and what became of it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileChangeFacts {
    pub patch_id: String,
    /// The path the tool call named, when it named one.
    pub path: Option<String>,
    /// `applied`, `proposed`, `reverted` or `discarded`.
    pub status: String,
}

/// A record the transcript points to instead of repeating.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RawDetailRef {
    /// `run`, `workflow_step`, `approval` or `artifact`.
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
}
