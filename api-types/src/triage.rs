//! CI triage (seed 000 §Triage GitHub CI): a scan of a pull request item's failing checks,
//! made by a worker, and a record per failing check or job of a head SHA, from which a fix
//! task is made and its run started.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::RunRecord;

closed_set! {
    /// Where a triage record stands: `triaged` (no task asked for), `task_created`,
    /// `run_requested` (its fix run started), `blocked` (no fix task could be made: the
    /// reason says why), `stale` (the pull request's head moved on: no CI was read), or
    /// `failed` (its evidence could not be read).
    TriageStatus {
        Triaged = "triaged",
        TaskCreated = "task_created",
        RunRequested = "run_requested",
        Blocked = "blocked",
        Stale = "stale",
        Failed = "failed",
    }
}

closed_set! {
    /// A scan: `queued` until its worker job ends it `done` (its summary says what it
    /// recorded) or `failed` (GitHub could not be read; the error says why).
    ScanStatus {
        Queued = "queued",
        Done = "done",
        Failed = "failed",
    }
}

closed_set! {
    /// What failed: a check run, or a GitHub Actions job (whose check run has its id).
    CheckKind {
        CheckRun = "check_run",
        WorkflowJob = "workflow_job",
    }
}

/// Most failing checks one scan records, and the default.
pub const MAX_TRIAGE_RECORDS: u32 = 20;
pub const DEFAULT_TRIAGE_RECORDS: u32 = 5;

/// `POST /v1/external-work/items/{item_id}/ci-triage`: what to scan for.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TriageRequest {
    /// The most failing checks to record, 1 to 20 (default 5).
    #[schema(minimum = 1, maximum = 20)]
    pub limit: Option<u32>,
    /// Make a fix task of each new record (default true).
    pub create_task: Option<bool>,
}

/// One scan of a pull request item's CI.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct TriageScan {
    pub id: String,
    pub item_id: String,
    pub max_records: i32,
    pub create_task: bool,
    pub status: ScanStatus,
    /// What the scan did, once done.
    #[schema(value_type = Option<TriageSummary>)]
    pub summary: Option<serde_json::Value>,
    pub last_error_code: Option<String>,
    pub last_error: Option<String>,
    pub requested_by: String,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// Seed 000's counts of a triage, with the records it recorded or found again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TriageSummary {
    /// New records.
    pub triaged: u64,
    /// New records with a fix task.
    pub task_created: u64,
    /// Failing checks of this head triaged before: their records are in `triage_ids`.
    pub duplicates: u64,
    pub blocked: u64,
    pub stale: u64,
    pub failed: u64,
    pub triage_ids: Vec<String>,
}

/// One failing check (or job) of a pull request's head, or the stale head a scan found.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct TriageRecord {
    pub id: String,
    pub item_id: String,
    /// The scan that recorded it.
    pub scan_id: String,
    pub repository: String,
    pub subject_number: i64,
    pub head_sha: String,
    /// The pull request's branch.
    pub head_ref: Option<String>,
    /// None on a stale record.
    pub check_kind: Option<CheckKind>,
    /// Empty on a stale record.
    pub check_name: String,
    pub check_id: Option<i64>,
    pub conclusion: Option<String>,
    pub details_url: Option<String>,
    pub status: TriageStatus,
    /// Why it is blocked, stale or failed.
    pub reason: Option<String>,
    pub task_id: Option<String>,
    pub run_id: Option<String>,
    /// The evidence: the check and a job's log (bounded, redacted), an artifact of the
    /// item's run.
    pub artifact_id: Option<String>,
    /// The fix run's idempotency key: `ci-triage:<id>:<task_id>:<head_sha>`.
    pub idempotency_key: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Which triage records `GET /v1/external-work/ci-triage` lists, as a client asks.
#[derive(Debug, Clone, Default)]
pub struct TriageListFilter {
    pub item_id: Option<String>,
    pub source_id: Option<String>,
    pub status: Option<TriageStatus>,
}

/// A fix run started (or found again) from a triage record.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FixRun {
    pub triage: TriageRecord,
    pub run: RunRecord,
}
