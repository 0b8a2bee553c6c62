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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolFacts {
    pub name: String,
    /// The MCP server for `mcp__SERVER__TOOL` names.
    pub server: Option<String>,
    pub operation_kind: OperationKind,
    pub arguments: String,
    pub result: Option<String>,
    pub is_error: bool,
    /// Set when a policy refused the call without running it: which one
    /// (`approval_policy`, `tool_not_allowed`, `sandbox_read_only`, `mcp_server_blocked`,
    /// `approval_rejected`); `result` says why.
    pub blocked: Option<String>,
    /// Whether `arguments` or `result` was cut to the inline limit.
    pub abridged: bool,
    pub latency_ms: Option<i64>,
}

/// An approval the run waited on, and the command that decides it while it is pending.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FileChangeFacts {
    pub patch_id: String,
    /// The path the tool call named, when it named one.
    pub path: Option<String>,
    /// `applied`, `proposed`, `reverted` or `discarded`.
    pub status: String,
}

/// A record the transcript points to instead of repeating.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RawDetailRef {
    /// `run`, `workflow_step`, `approval` or `artifact`.
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
}

/// A frame of a run's transcript as it changes (`projection=transcript` on the run's
/// stream, SSE event `transcript`): a snapshot when the stream opens, then each change
/// the run's next events made. Applied in order to the snapshot, they give what `GET
/// …/transcript` reads at the same `sequence`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TranscriptEvent {
    /// The whole transcript; every stream starts with one.
    TranscriptSnapshot {
        transcript: RunTranscript,
        sequence: i64,
    },
    /// A new block, placed after `after_block_id` (first when null).
    BlockStarted {
        turn_id: String,
        after_block_id: Option<String>,
        block: TranscriptBlock,
        sequence: i64,
    },
    /// A block that changed and goes on (an approval still pending, a step still running).
    BlockDelta {
        turn_id: String,
        block_id: String,
        patch: BlockPatch,
        sequence: i64,
    },
    /// A block that reached its end.
    BlockCompleted {
        turn_id: String,
        block_id: String,
        status: BlockStatus,
        patch: BlockPatch,
        sequence: i64,
    },
    /// The turn's status changed (with the run's) and it goes on.
    TurnChanged {
        turn_id: String,
        status: TurnStatus,
        updated_at: DateTime<Utc>,
        sequence: i64,
    },
    /// The turn ended (with the run); `answer` is the run's when it has one.
    TurnCompleted {
        turn_id: String,
        status: TurnStatus,
        answer: Option<String>,
        updated_at: DateTime<Utc>,
        sequence: i64,
    },
}

/// What a change replaces in a block: its status, its words, its figures and its parts;
/// never its id, kind or start.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BlockPatch {
    pub status: Option<BlockStatus>,
    pub text: Option<String>,
    pub model_call: Option<ModelCallFacts>,
    pub tool: Option<ToolFacts>,
    pub approval: Option<ApprovalFacts>,
    pub file_change: Option<FileChangeFacts>,
    pub updated_at: DateTime<Utc>,
}

impl BlockPatch {
    /// The patch that makes a block `to`.
    pub fn to(block: &TranscriptBlock) -> BlockPatch {
        BlockPatch {
            status: block.status,
            text: block.text.clone(),
            model_call: block.model_call.clone(),
            tool: block.tool.clone(),
            approval: block.approval.clone(),
            file_change: block.file_change.clone(),
            updated_at: block.updated_at,
        }
    }

    /// `block` with the patch applied.
    pub fn apply(self, block: &mut TranscriptBlock) {
        block.status = self.status;
        block.text = self.text;
        block.model_call = self.model_call;
        block.tool = self.tool;
        block.approval = self.approval;
        block.file_change = self.file_change;
        block.updated_at = self.updated_at;
    }
}

impl TurnStatus {
    /// Whether a turn in this status has ended (its run has).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            TurnStatus::Succeeded | TurnStatus::Failed | TurnStatus::Cancelled
        )
    }
}

impl BlockStatus {
    /// Whether a block in this status has ended.
    pub fn is_final(self) -> bool {
        !matches!(self, BlockStatus::Running | BlockStatus::WaitingForApproval)
    }
}

impl RunTranscript {
    /// The transcript with `event` applied (a snapshot replaces it): how a client keeps
    /// one from the stream.
    pub fn apply(&mut self, event: TranscriptEvent) {
        match event {
            TranscriptEvent::TranscriptSnapshot {
                transcript,
                sequence,
            } => {
                *self = transcript;
                self.sequence = sequence;
            }
            TranscriptEvent::BlockStarted {
                turn_id,
                after_block_id,
                block,
                sequence,
            } => {
                self.sequence = sequence;
                if let Some(turn) = self.turns.iter_mut().find(|t| t.id == turn_id) {
                    let at = after_block_id
                        .and_then(|after| turn.blocks.iter().position(|b| b.id == after))
                        .map_or(0, |position| position + 1);
                    turn.blocks.insert(at, block);
                }
            }
            TranscriptEvent::BlockDelta {
                turn_id,
                block_id,
                patch,
                sequence,
            }
            | TranscriptEvent::BlockCompleted {
                turn_id,
                block_id,
                patch,
                sequence,
                ..
            } => {
                self.sequence = sequence;
                let turn = self.turns.iter_mut().find(|t| t.id == turn_id);
                let block = turn.and_then(|t| t.blocks.iter_mut().find(|b| b.id == block_id));
                if let Some(block) = block {
                    patch.apply(block);
                }
            }
            TranscriptEvent::TurnChanged {
                turn_id,
                status,
                updated_at,
                sequence,
            } => self.turn_is(&turn_id, (status, updated_at), sequence),
            TranscriptEvent::TurnCompleted {
                turn_id,
                status,
                answer,
                updated_at,
                sequence,
            } => {
                self.answer = answer;
                self.turn_is(&turn_id, (status, updated_at), sequence);
            }
        }
    }

    fn turn_is(&mut self, turn_id: &str, now: (TurnStatus, DateTime<Utc>), sequence: i64) {
        self.sequence = sequence;
        if let Some(turn) = self.turns.iter_mut().find(|t| t.id == turn_id) {
            (turn.status, turn.updated_at) = now;
        }
    }

    /// The frames that make `self` into `next`, in order: new blocks where they stand,
    /// changed blocks (completed when their status is final), then the turn's status.
    pub fn changes(&self, next: &RunTranscript) -> Vec<TranscriptEvent> {
        let sequence = next.sequence;
        let mut frames = Vec::new();
        for turn in &next.turns {
            let before = self.turns.iter().find(|t| t.id == turn.id);
            let old = |id: &str| before.and_then(|t| t.blocks.iter().find(|b| b.id == id));
            for (position, block) in turn.blocks.iter().enumerate() {
                let turn_id = turn.id.clone();
                match old(&block.id) {
                    None => frames.push(TranscriptEvent::BlockStarted {
                        turn_id,
                        after_block_id: position.checked_sub(1).map(|p| turn.blocks[p].id.clone()),
                        block: block.clone(),
                        sequence,
                    }),
                    Some(was) if was == block => {}
                    Some(_) => {
                        let (block_id, patch) = (block.id.clone(), BlockPatch::to(block));
                        frames.push(match block.status.filter(|s| s.is_final()) {
                            Some(status) => TranscriptEvent::BlockCompleted {
                                turn_id,
                                block_id,
                                status,
                                patch,
                                sequence,
                            },
                            None => TranscriptEvent::BlockDelta {
                                turn_id,
                                block_id,
                                patch,
                                sequence,
                            },
                        });
                    }
                }
            }
            let (turn_id, status, updated_at) = (turn.id.clone(), turn.status, turn.updated_at);
            let changed = before.map(|t| (t.status, t.updated_at)) != Some((status, updated_at));
            if status.is_final() && (changed || self.answer != next.answer) {
                let answer = next.answer.clone();
                frames.push(TranscriptEvent::TurnCompleted {
                    turn_id,
                    status,
                    answer,
                    updated_at,
                    sequence,
                });
            } else if changed {
                frames.push(TranscriptEvent::TurnChanged {
                    turn_id,
                    status,
                    updated_at,
                    sequence,
                });
            }
        }
        frames
    }
}

closed_set! {
    /// Where a context layer comes from.
    LayerOrigin {
        /// The operator's `KEEL_AGENT_SYSTEM_PROMPT`.
        Runtime = "runtime",
        /// An instruction file of the workspace (`AGENTS.md`, `CLAUDE.md`).
        Workspace = "workspace",
        /// The task's `system_prompt`.
        Task = "task",
    }
}

closed_set! {
    /// What a run's context was read from.
    ContextSource {
        /// The base the run kept when it started (it had a runtime or workspace layer, or
        /// carries on another run's conversation): what its model read.
        Stored = "stored",
        /// The task's own system prompt and prompt: the run started with no other layer.
        Task = "task",
        /// The run has not started: the task's layers, before the runtime's and the
        /// workspace's are composed at its start.
        NotStarted = "not_started",
    }
}

/// The prompt layers an agent loop run started from (seed 004's context packet,
/// `GET …/runs/{run_id}/context`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunContextPacket {
    pub task_id: String,
    pub run_id: String,
    pub source: ContextSource,
    /// The system prompt's layers, in the order the model read them.
    pub layers: Vec<ContextLayer>,
    /// The message the run started from: a continuation's, else the task's prompt.
    pub prompt: Option<String>,
    /// Messages of earlier turns a resumed or continued run carries (between the layers
    /// and `prompt`); its transcript's source run shows them.
    pub carried_messages: usize,
}

/// One system prompt layer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ContextLayer {
    pub origin: LayerOrigin,
    pub content: String,
}
