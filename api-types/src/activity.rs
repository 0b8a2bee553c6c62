//! A run's activity (seed 004's per-run `activity` array, `projection=activity` on its
//! stream): a compact timeline a client shows without rebuilding it from steps, artifacts
//! and approvals. An agent loop's comes from its transcript (each model call, tool call,
//! approval and file change, then the files changed, the answer and the result); any other
//! run's from its steps and its result.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::RawDetailRef;

closed_set! {
    /// What an activity item stands for.
    ActivityKind {
        /// A model call of an agent loop (its text, abridged, or the tools it asked for).
        Thinking = "thinking",
        /// A tool call: what it did and an abridged result.
        ToolCall = "tool_call",
        /// One file a tool call changed or proposed to change.
        Patch = "patch",
        /// Every file the run changed so far (`paths`).
        ChangedFiles = "changed_files",
        /// The model's last text of a completed run: its answer.
        FinalAnswer = "final_answer",
        /// An approval the run waited on (`approval_id`, `needs_action` while pending).
        Approval = "approval",
        /// How the run ended; last, once it has.
        RunResult = "run_result",
        /// A step of the runtime's own (workspace setup, a hook, a process).
        Step = "step",
    }
}

closed_set! {
    /// Where an activity item stands.
    ActivityStatus {
        Running = "running",
        /// For a person: a pending approval, a proposed patch.
        Waiting = "waiting",
        Completed = "completed",
        Failed = "failed",
        /// A policy refused it (`reason` says which and why); the raw step completed.
        Denied = "denied",
        Cancelled = "cancelled",
    }
}

/// One item of a run's activity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ActivityItem {
    /// Stable across reads: the step's, approval's or patch's id, or the item's kind for
    /// `changed_files`, `final_answer` and `run_result`.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: ActivityKind,
    pub status: ActivityStatus,
    /// One line: the tool and what it was asked, the model call, the file, the end.
    pub title: String,
    /// A few lines at most (280 characters): the text, result or action summary.
    pub summary: Option<String>,
    /// Why it was denied, failed or ended as it did.
    pub reason: Option<String>,
    /// An approval's id, to decide it with.
    pub approval_id: Option<String>,
    /// True while a person's decision is awaited.
    pub needs_action: bool,
    /// The files a patch or the run changed.
    pub paths: Vec<String>,
    /// Where the whole record is (`workflow_step`, `approval`, `artifact` or `run`).
    pub raw_detail_ref: Option<RawDetailRef>,
    pub at: DateTime<Utc>,
}

/// The most characters of an item's `summary`.
pub const ACTIVITY_SUMMARY_CHARS: usize = 280;

/// `text` cut to `most` characters (an ellipsis after), and whether it was.
pub fn cut_chars(text: &str, most: usize) -> (String, bool) {
    match text.char_indices().nth(most) {
        Some((end, _)) => (format!("{}…", &text[..end]), true),
        None => (text.to_string(), false),
    }
}
