//! Schedules: a task's one trigger, `once` at an instant or `cron` in an IANA time zone.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of `PUT /v1/tasks/{id}/schedule`, as the client sent it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "kind": "cron", "timezone": "Europe/Madrid", "cron_expression": "0 9 * * 1-5",
    "enabled": true, "revision": 3
}))]
pub struct ScheduleDraft {
    pub kind: Option<String>,
    pub timezone: Option<String>,
    pub enabled: Option<bool>,
    pub run_at: Option<String>,
    pub cron_expression: Option<String>,
    /// The revision the client read; a stale one makes the edit fail instead of
    /// overwriting what a dispatcher or another edit did since.
    pub revision: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[schema(example = json!({
    "id": "sched_01a22b05d4cc7d6e8f9a0b1c2d3e4f5a", "task_id": "task_01a22b05c3e1734c9d7a0f2b6e41d890",
    "kind": "cron", "timezone": "Europe/Madrid", "run_at": null, "cron_expression": "0 9 * * 1-5",
    "enabled": true, "next_run_at": "2026-12-01T08:00:00Z", "revision": 3,
    "created_at": "2026-11-30T09:00:00Z", "updated_at": "2026-11-30T09:00:00Z"
}))]
pub struct ScheduleRecord {
    pub id: String,
    pub task_id: String,
    pub kind: String,
    pub timezone: String,
    pub run_at: Option<DateTime<Utc>>,
    pub cron_expression: Option<String>,
    pub enabled: bool,
    /// Omitted while paused (or spent), as the API promises.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_run_at: Option<DateTime<Utc>>,
    pub revision: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The workspace the schedule (and the runs it creates) belongs to.
    #[serde(skip)]
    pub workspace_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct OccurrenceRecord {
    pub id: String,
    pub task_id: String,
    pub schedule_id: String,
    pub scheduled_for: DateTime<Utc>,
    pub status: String,
    pub claimed_at: DateTime<Utc>,
    pub run_id: Option<String>,
    pub error: Option<String>,
    pub completed_at: Option<DateTime<Utc>>,
}
