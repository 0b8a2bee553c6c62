//! Steps: what a run did, one row per executor step.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::events::{self, NewEvent};
use super::{Result, StoreError};
use crate::domain::{EventType, Scope, new_id};

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct StepRecord {
    pub id: String,
    pub run_id: String,
    pub task_id: String,
    pub index: i32,
    pub name: String,
    pub status: String,
    pub input: serde_json::Value,
    pub output: Option<serde_json::Value>,
    pub error: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

const STEP_COLUMNS: &str =
    "id, run_id, task_id, index, name, status, input, output, error, started_at, finished_at";

pub async fn start(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    run_id: &str,
    name: &str,
    input: &serde_json::Value,
) -> Result<StepRecord> {
    let step: StepRecord = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO steps (id, run_id, task_id, index, name, status, input, workspace_id)
         VALUES ($1, $2, $3,
                 COALESCE((SELECT max(index) FROM steps WHERE run_id = $2), 0) + 1,
                 $4, 'running', $5, $6)
         RETURNING {STEP_COLUMNS}"
    )))
    .bind(new_id("step"))
    .bind(run_id)
    .bind(task_id)
    .bind(name)
    .bind(input)
    .bind(scope.workspace())
    .fetch_one(&mut *conn)
    .await?;
    let data = serde_json::json!({ "step_id": step.id, "index": step.index, "name": name });
    events::append(
        conn,
        scope,
        &[NewEvent::new(task_id, run_id, EventType::StepStarted).with(data)],
    )
    .await?;
    Ok(step)
}

/// Ends a running step as `completed` (with output) or `failed` (with an error).
pub async fn finish(
    conn: &mut PgConnection,
    scope: &Scope,
    step_id: &str,
    output: Option<&serde_json::Value>,
    error: Option<&str>,
) -> Result<StepRecord> {
    let status = if error.is_some() {
        "failed"
    } else {
        "completed"
    };
    let step: StepRecord = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE steps SET status = $2, output = $3, error = $4, finished_at = now()
         WHERE id = $1 AND workspace_id = $5 AND status = 'running' RETURNING {STEP_COLUMNS}"
    )))
    .bind(step_id)
    .bind(status)
    .bind(output)
    .bind(error)
    .bind(scope.workspace())
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(StoreError::NotFound("running step"))?;
    let event_type = if error.is_some() {
        EventType::StepFailed
    } else {
        EventType::StepFinished
    };
    let data = serde_json::json!({ "step_id": step.id, "index": step.index, "name": step.name,
                                   "status": status, "output": output, "error": error });
    events::append(
        conn,
        scope,
        &[NewEvent::new(&step.task_id, &step.run_id, event_type).with(data)],
    )
    .await?;
    Ok(step)
}

pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    after_index: i32,
    limit: i64,
) -> Result<Vec<StepRecord>> {
    let rows = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {STEP_COLUMNS} FROM steps WHERE workspace_id = $1 AND run_id = $2 AND index > $3
         ORDER BY index LIMIT $4"
    )))
    .bind(scope.workspace())
    .bind(run_id)
    .bind(after_index)
    .bind(limit)
    .fetch_all(conn)
    .await?;
    Ok(rows)
}
