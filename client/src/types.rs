//! The wire types the client reads and sends. Until the shared contract crate
//! (`keel-api-types`) lands, these are the client's own copies of the fields it uses;
//! unknown fields are ignored, so a newer server still reads.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A page of a list (`{"object": "list", "data", "has_more", "next_cursor"}`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// One resource (`{"object", "data"}`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Object<T> {
    pub object: String,
    pub data: T,
}

/// What a deletion removed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deleted {
    pub object: String,
    pub id: String,
    pub deleted: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub execution_kind: String,
    /// `not_started` or the latest run's status.
    pub status: String,
    pub prompt: Option<String>,
    pub shell_command: Option<String>,
    pub git_command: Option<String>,
    pub file_path: Option<String>,
    pub run_count: i32,
    pub latest_run_id: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A task to create. Only the fields set are sent; the server applies its defaults.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TaskDraft {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shell_command: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub git_command: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_directory: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

/// The optional body of start, retry and resume.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StartRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_micros_usd: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    pub id: String,
    pub task_id: String,
    pub number: i32,
    /// `awaiting_approval`, `queued`, `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
    pub attempt: i32,
    pub exit_code: Option<i32>,
    pub last_error: Option<String>,
    pub total_cost_micros_usd: i64,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl Run {
    pub fn is_terminal(&self) -> bool {
        matches!(self.status.as_str(), "completed" | "failed" | "cancelled")
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    pub id: String,
    pub index: i32,
    pub name: String,
    pub status: String,
    pub error: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Artifact {
    pub id: String,
    pub run_id: Option<String>,
    pub task_id: Option<String>,
    pub media_job_id: Option<String>,
    pub name: String,
    pub kind: String,
    pub content_type: String,
    pub size_bytes: i64,
    pub status: String,
}

/// An event of a run's or a media job's log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    pub event_id: String,
    pub task_id: Option<String>,
    pub run_id: Option<String>,
    pub media_job_id: Option<String>,
    pub sequence: i64,
    /// The event's position in the public feed.
    pub cursor: String,
    pub occurred_at: DateTime<Utc>,
    #[serde(rename = "type")]
    pub event_type: String,
    pub data: serde_json::Value,
}

/// Live model text of a run's stream (`model.delta`; not persisted).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelDelta {
    pub model_call_index: i64,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    pub task_id: String,
    pub run_id: String,
    pub kind: String,
    pub status: String,
    pub action_summary: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// Approve or reject.
#[derive(Debug, Clone, Serialize)]
pub struct ResolveRequest {
    /// `approve` or `reject`.
    pub decision: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A decision's result: the approval and the run it gated.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resolution {
    pub approval: Approval,
    pub run: Run,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Schedule {
    pub id: String,
    pub task_id: String,
    /// `once` or `cron`.
    pub kind: String,
    pub timezone: String,
    pub run_at: Option<DateTime<Utc>>,
    pub cron_expression: Option<String>,
    pub enabled: bool,
    pub next_run_at: Option<DateTime<Utc>>,
    pub revision: i64,
}

/// A schedule to create or replace.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScheduleDraft {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron_expression: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MediaJob {
    pub id: String,
    pub provider_id: String,
    pub operation: String,
    pub prompt: String,
    /// `queued`, `running`, `succeeded`, `failed` or `cancelled`.
    pub status: String,
    pub attempt: i32,
    pub last_error_code: Option<String>,
    pub last_error: Option<String>,
    pub artifact_ids: Vec<String>,
    pub created_at: DateTime<Utc>,
}

impl MediaJob {
    pub fn is_terminal(&self) -> bool {
        matches!(self.status.as_str(), "succeeded" | "failed" | "cancelled")
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct MediaJobDraft {
    pub provider_id: String,
    /// `image_generate`, `image_edit` or `video_generate`.
    pub operation: String,
    pub prompt: String,
    pub input: serde_json::Value,
}

/// A provider preset as the API shows it (secrets by reference only).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Provider {
    pub id: String,
    pub kind: String,
    pub display_name: String,
    pub model: String,
    pub api: String,
    pub base_url: String,
    pub api_key_configured: bool,
    pub capabilities: Vec<String>,
    pub enabled: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProviderCheck {
    pub ok: bool,
    pub code: String,
    pub message: String,
    pub live: bool,
    pub checked_at: DateTime<Utc>,
}

/// `GET /v1/system/stats`: the workspace's queue and leases, and live workers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SystemStats {
    pub queue: Vec<KindStats>,
    pub active_leases: i64,
    pub workers: Workers,
    pub version: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KindStats {
    pub kind: String,
    pub depth: i64,
    pub ready: i64,
    pub leased: i64,
    pub oldest_age_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Workers {
    pub live: usize,
    pub list: Vec<WorkerStats>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerStats {
    pub id: String,
    pub hostname: String,
    pub pid: i32,
    pub concurrency: i32,
    pub active_leases: i64,
    pub last_seen_ms_ago: i64,
}

/// A state change of the audit trail.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Transition {
    pub entity_type: String,
    pub entity_id: String,
    pub task_id: Option<String>,
    pub from_status: Option<String>,
    pub to_status: String,
}
