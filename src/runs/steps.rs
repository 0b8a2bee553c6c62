//! Steps: what a run did, one row per executor step.

use chrono::{DateTime, Utc};
use keel_workers::StepResult;
use sqlx::PgConnection;

use crate::db::{Result, StoreError};
use crate::domain::{EventType, Scope, new_id};
use crate::events;
use crate::events::NewEvent;
use keel_api_types::StepStatus;

pub(crate) use keel_api_types::StepRecord;

/// `query_as!` of [`StepRecord`]s: `$before` (up to its `SELECT` or `RETURNING`), then the
/// step's columns (`status` as a [`StepStatus`]), then `$after` (its `FROM …`, or nothing).
macro_rules! query_steps {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            StepRecord,
            $before
                + r#" id, run_id, task_id, index, name, status AS "status: StepStatus", input,
                      output, error, started_at, finished_at "#
                + $after
            $(, $arg)*
        )
    };
}

/// A step as its executor reported it, possibly already ended: a run context may hold a
/// step back and write it once, started and finished, with the next durable write.
pub struct NewStep<'a> {
    pub(crate) id: &'a str,
    pub(crate) task_id: &'a str,
    pub(crate) run_id: &'a str,
    pub(crate) name: &'a str,
    pub(crate) input: &'a serde_json::Value,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) ended: Option<(&'a StepResult, DateTime<Utc>)>,
}

/// Starts a step now, with its `step.started` event.
pub async fn start(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    run_id: &str,
    name: &str,
    input: &serde_json::Value,
) -> Result<StepRecord> {
    let id = new_id("step");
    let step = NewStep {
        id: &id,
        task_id,
        run_id,
        name,
        input,
        started_at: Utc::now(),
        ended: None,
    };
    let step = insert(conn, scope, &step).await?;
    events::append(conn, scope, &[started_event(&step)]).await?;
    Ok(step)
}

/// Stores a step with the next index of its run; its events are [`started_event`] and, once
/// it ended, [`finished_event`].
pub async fn insert(
    conn: &mut PgConnection,
    scope: &Scope,
    step: &NewStep<'_>,
) -> Result<StepRecord> {
    let (status, output, error, finished_at) = match step.ended {
        None => ("running", None, None, None),
        Some((result, at)) => {
            let (output, error) = result_columns(result);
            (status_of(result), output, error, Some(at))
        }
    };
    let step = query_steps!(
        "INSERT INTO steps (id, run_id, task_id, index, name, status, input, output, error,
                            started_at, finished_at, workspace_id)
         VALUES ($1, $2, $3,
                 COALESCE((SELECT max(index) FROM steps WHERE run_id = $2), 0) + 1,
                 $4, $5, $6, $7, $8, $9, $10, $11)
         RETURNING",
        "",
        step.id,
        step.run_id,
        step.task_id,
        step.name,
        status,
        step.input,
        output,
        error,
        step.started_at,
        finished_at,
        scope.workspace(),
    )
    .fetch_one(conn)
    .await?;
    Ok(step)
}

/// Ends a running step as `completed` (with output) or `failed` (with an error), with its
/// event.
pub async fn finish(
    conn: &mut PgConnection,
    scope: &Scope,
    step_id: &str,
    output: Option<&serde_json::Value>,
    error: Option<&str>,
) -> Result<StepRecord> {
    let result = match (output, error) {
        (_, Some(error)) => StepResult::Failed {
            error: error.to_string(),
        },
        (output, None) => StepResult::Completed {
            output: output.cloned().unwrap_or(serde_json::Value::Null),
        },
    };
    let step = end(conn, scope, step_id, &result, Utc::now()).await?;
    events::append(conn, scope, &[finished_event(&step)]).await?;
    Ok(step)
}

/// Ends a running step; its event is [`finished_event`].
pub(crate) async fn end(
    conn: &mut PgConnection,
    scope: &Scope,
    step_id: &str,
    result: &StepResult,
    at: DateTime<Utc>,
) -> Result<StepRecord> {
    let (output, error) = result_columns(result);
    query_steps!(
        "UPDATE steps SET status = $2, output = $3, error = $4, finished_at = $5
         WHERE id = $1 AND workspace_id = $6 AND status = 'running'
         RETURNING",
        "",
        step_id,
        status_of(result),
        output,
        error,
        at,
        scope.workspace(),
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("running step"))
}

/// `step.started` of a stored step.
pub(crate) fn started_event(step: &StepRecord) -> NewEvent<'_> {
    let data = serde_json::json!({ "step_id": step.id, "index": step.index, "name": step.name });
    NewEvent::new(&step.task_id, &step.run_id, EventType::StepStarted).with(data)
}

/// `step.finished` or `step.failed` of an ended step.
pub(crate) fn finished_event(step: &StepRecord) -> NewEvent<'_> {
    let event_type = if step.status == StepStatus::Failed {
        EventType::StepFailed
    } else {
        EventType::StepFinished
    };
    let data = serde_json::json!({ "step_id": step.id, "index": step.index, "name": step.name,
                                   "status": step.status, "output": step.output,
                                   "error": step.error });
    NewEvent::new(&step.task_id, &step.run_id, event_type).with(data)
}

fn status_of(result: &StepResult) -> &'static str {
    match result {
        StepResult::Completed { .. } => "completed",
        StepResult::Failed { .. } => "failed",
    }
}

fn result_columns(result: &StepResult) -> (Option<&serde_json::Value>, Option<&str>) {
    match result {
        StepResult::Completed { output } => (Some(output).filter(|o| !o.is_null()), None),
        StepResult::Failed { error } => (None, Some(error)),
    }
}

pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    after_index: i32,
    limit: i64,
) -> Result<Vec<StepRecord>> {
    let rows = query_steps!(
        "SELECT",
        "FROM steps WHERE workspace_id = $1 AND run_id = $2 AND index > $3
         ORDER BY index LIMIT $4",
        scope.workspace(),
        run_id,
        after_index,
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// A run's last `limit` steps, in their order.
pub async fn latest(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    limit: i64,
) -> Result<Vec<StepRecord>> {
    let mut rows = query_steps!(
        "SELECT",
        "FROM steps WHERE workspace_id = $1 AND run_id = $2 ORDER BY index DESC LIMIT $3",
        scope.workspace(),
        run_id,
        limit,
    )
    .fetch_all(conn)
    .await?;
    rows.reverse();
    Ok(rows)
}

/// One of a run's steps.
pub async fn get(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    step_id: &str,
) -> Result<StepRecord> {
    query_steps!(
        "SELECT",
        "FROM steps WHERE workspace_id = $1 AND run_id = $2 AND id = $3",
        scope.workspace(),
        run_id,
        step_id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("step"))
}
