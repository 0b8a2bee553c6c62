//! The append-only event log: a per-run `sequence` and a global cursor (`id`) for the feed.
//!
//! Appending takes a transaction-level advisory lock that is held until commit, so events
//! commit in the order of their ids: a reader that has seen id N will never later find a
//! newly committed event below N. Append events last in a transaction, after every row
//! lock it takes, so the lock is held briefly and lock order stays the same everywhere.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::Result;
use crate::domain::{EventType, Scope, new_id};

/// Arbitrary constant naming the event-order lock.
const EVENT_ORDER_LOCK: i64 = 0x6b65_656c_0001;
pub const CHANNEL: &str = "keel_events";

/// What an event is about: each subject has its own `sequence`.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    Run { task_id: &'a str, run_id: &'a str },
    MediaJob(&'a str),
}

impl<'a> Subject<'a> {
    /// The column naming the subject in `run_events` and `artifacts`, and its id.
    pub fn key(self) -> (&'static str, &'a str) {
        match self {
            Subject::Run { run_id, .. } => ("run_id", run_id),
            Subject::MediaJob(id) => ("media_job_id", id),
        }
    }

    pub fn columns(self) -> (Option<&'a str>, Option<&'a str>, Option<&'a str>) {
        match self {
            Subject::Run { task_id, run_id } => (Some(task_id), Some(run_id), None),
            Subject::MediaJob(id) => (None, None, Some(id)),
        }
    }
}

pub struct NewEvent<'a> {
    pub subject: Subject<'a>,
    pub event_type: EventType,
    pub data: serde_json::Value,
}

impl<'a> NewEvent<'a> {
    pub fn new(task_id: &'a str, run_id: &'a str, event_type: EventType) -> Self {
        NewEvent {
            subject: Subject::Run { task_id, run_id },
            event_type,
            data: serde_json::json!({}),
        }
    }

    pub fn media_job(media_job_id: &'a str, event_type: EventType) -> Self {
        NewEvent {
            subject: Subject::MediaJob(media_job_id),
            event_type,
            data: serde_json::json!({}),
        }
    }

    pub fn with(mut self, data: serde_json::Value) -> Self {
        self.data = data;
        self
    }
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(example = json!({
    "schema_version": 1, "event_id": "evt_01a22b05d3bb7c6d8e9f0a1b2c3d4e5f",
    "task_id": "task_01a22b05c3e1734c9d7a0f2b6e41d890",
    "run_id": "run_01a22b05d1f27a6b8c9e0d1f2a3b4c5d", "media_job_id": null, "sequence": 3,
    "global_sequence": 1207, "occurred_at": "2026-11-30T09:01:12Z", "type": "run.finished",
    "data": { "status": "completed", "exit_code": 0 }
}))]
pub struct EventRecord {
    pub schema_version: i32,
    pub event_id: String,
    /// The run's task and the run (null on a media job's events).
    pub task_id: Option<String>,
    pub run_id: Option<String>,
    /// The media job (null on a run's events).
    pub media_job_id: Option<String>,
    /// The event's position among its run's (or media job's) events.
    pub sequence: i64,
    pub global_sequence: i64,
    pub occurred_at: DateTime<Utc>,
    #[serde(rename = "type")]
    #[sqlx(rename = "type")]
    pub event_type: String,
    pub data: serde_json::Value,
}

const SELECT_EVENT: &str = "
    SELECT 1 AS schema_version, event_id, task_id, run_id, media_job_id, sequence,
           id AS global_sequence,
           occurred_at, type, data
    FROM run_events";

/// Appends events of one workspace's subjects.
pub async fn append(conn: &mut PgConnection, scope: &Scope, events: &[NewEvent<'_>]) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(EVENT_ORDER_LOCK)
        .execute(&mut *conn)
        .await?;
    let mut last_id = 0i64;
    for event in events {
        let (task_id, run_id, media_job_id) = event.subject.columns();
        let (column, subject_id) = event.subject.key();
        last_id = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "INSERT INTO run_events (event_id, task_id, run_id, media_job_id, sequence, type, data,
                                     workspace_id)
             VALUES ($1, $2, $3, $4,
                     COALESCE((SELECT max(sequence) FROM run_events WHERE {column} = $5), 0) + 1,
                     $6, $7, $8)
             RETURNING id"
        )))
        .bind(new_id("evt"))
        .bind(task_id)
        .bind(run_id)
        .bind(media_job_id)
        .bind(subject_id)
        .bind(event.event_type.as_str())
        .bind(&event.data)
        .bind(scope.workspace())
        .fetch_one(&mut *conn)
        .await?;
    }
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(last_id.to_string())
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn list_for_run(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    after_sequence: i64,
    limit: i64,
) -> Result<Vec<EventRecord>> {
    let rows = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{SELECT_EVENT} WHERE workspace_id = $1 AND run_id = $2 AND sequence > $3
         ORDER BY sequence LIMIT $4"
    )))
    .bind(scope.workspace())
    .bind(run_id)
    .bind(after_sequence)
    .bind(limit)
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Filters of the public feed: they AND together; the types within `event_types` OR.
#[derive(Debug, Clone, Default)]
pub struct FeedFilter {
    pub event_types: Option<Vec<String>>,
    pub task_id: Option<String>,
    pub media_job_id: Option<String>,
}

/// One workspace's events in global order: another workspace's never appear, though
/// their ids interleave.
pub async fn list_feed(
    conn: &mut PgConnection,
    scope: &Scope,
    filter: &FeedFilter,
    after: i64,
    limit: i64,
) -> Result<Vec<EventRecord>> {
    let rows = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{SELECT_EVENT}
         WHERE workspace_id = $6 AND id > $1 AND ($2::text[] IS NULL OR type = ANY($2))
           AND ($3::text IS NULL OR task_id = $3)
           AND ($4::text IS NULL OR media_job_id = $4)
         ORDER BY id LIMIT $5"
    )))
    .bind(after)
    .bind(&filter.event_types)
    .bind(&filter.task_id)
    .bind(&filter.media_job_id)
    .bind(limit)
    .bind(scope.workspace())
    .fetch_all(conn)
    .await?;
    Ok(rows)
}
