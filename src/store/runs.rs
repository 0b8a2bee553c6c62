//! Run rows: admission (the one-active-run guard), status transitions and cancellation.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::events::{self, NewEvent};
use super::{Result, StoreError, tasks, violates};
use crate::domain::{EventType, RunStatus, new_id};
use crate::queue;

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct RunRecord {
    pub id: String,
    pub task_id: String,
    pub number: i32,
    pub status: String,
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub exit_code: Option<i32>,
    pub last_error: Option<String>,
    pub retried_from_run_id: Option<String>,
    pub schedule_id: Option<String>,
    pub schedule_occurrence_id: Option<String>,
    pub scheduled_for: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

impl RunRecord {
    pub fn status(&self) -> RunStatus {
        RunStatus::parse(&self.status).expect("the database only holds known statuses")
    }
}

const RUN_COLUMNS: &str = "id, task_id, number, status, attempt, worker_id, exit_code, last_error,
    retried_from_run_id, schedule_id, schedule_occurrence_id, scheduled_for, created_at,
    started_at, finished_at, updated_at";

/// What a run-creating request asks for.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    pub retried_from: Option<String>,
    /// The `Idempotency-Key` header and the request it came with.
    pub idempotency: Option<(String, serde_json::Value)>,
    /// Set when a schedule occurrence, not a client, asks for the run.
    pub schedule: Option<ScheduleProvenance>,
}

/// Which schedule occurrence created a run, and the nominal time it fired for.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleProvenance {
    pub schedule_id: String,
    pub schedule_occurrence_id: String,
    pub scheduled_for: DateTime<Utc>,
}

pub enum Admitted {
    New(RunRecord),
    /// The same idempotency key and request were seen before: the original run.
    Replayed(RunRecord),
}

/// Creates the next run of a task and enqueues it, in the caller's transaction. At most one
/// run per task is active: the task row lock serializes admissions, and the partial unique
/// index `runs_one_active_per_task` refuses a second active run whatever the code does.
pub async fn admit(
    conn: &mut PgConnection,
    task_id: &str,
    admission: Admission,
) -> Result<Admitted> {
    tasks::lock(conn, task_id).await?;
    if let Some((key, request)) = &admission.idempotency
        && let Some((run, seen)) = find_by_idempotency_key(conn, task_id, key).await?
    {
        if &seen != request {
            return Err(StoreError::Conflict(format!(
                "Idempotency-Key '{key}' was already used with a different request"
            )));
        }
        return Ok(Admitted::Replayed(run));
    }
    if let Some(source) = &admission.retried_from {
        get(conn, task_id, source).await?;
    }
    if let Some(active) = active_run(conn, task_id).await? {
        return Err(StoreError::Conflict(format!(
            "task {task_id} already has an active run ({active})"
        )));
    }
    let run_id = new_id("run");
    let (number, priority): (i32, i32) = sqlx::query_as(
        "UPDATE tasks SET run_count = run_count + 1, latest_run_id = $2, updated_at = now()
         WHERE id = $1 RETURNING run_count, priority",
    )
    .bind(task_id)
    .bind(&run_id)
    .fetch_one(&mut *conn)
    .await?;
    let (key, request) = admission.idempotency.unzip();
    let schedule = admission.schedule.as_ref();
    let inserted = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO runs (id, task_id, number, status, retried_from_run_id, idempotency_key,
                           idempotency_request, schedule_id, schedule_occurrence_id,
                           scheduled_for)
         VALUES ($1, $2, $3, 'queued', $4, $5, $6, $7, $8, $9) RETURNING {RUN_COLUMNS}"
    )))
    .bind(&run_id)
    .bind(task_id)
    .bind(number)
    .bind(&admission.retried_from)
    .bind(key)
    .bind(request)
    .bind(schedule.map(|s| &s.schedule_id))
    .bind(schedule.map(|s| &s.schedule_occurrence_id))
    .bind(schedule.map(|s| s.scheduled_for))
    .fetch_one(&mut *conn)
    .await;
    let run: RunRecord = match inserted {
        Err(e) if violates(&e, "runs_one_active_per_task") => {
            return Err(StoreError::Conflict(format!(
                "task {task_id} already has an active run"
            )));
        }
        other => other?,
    };
    queue::enqueue(conn, queue::RUN_KIND, &run.id, priority).await?;
    let mut created =
        serde_json::json!({ "number": number, "retried_from_run_id": admission.retried_from });
    if let Some(schedule) = schedule {
        created["schedule"] = serde_json::json!(schedule);
    }
    events::append(
        conn,
        &[
            NewEvent::new(task_id, &run_id, EventType::RunCreated).with(created),
            NewEvent::new(task_id, &run_id, EventType::RunQueued),
        ],
    )
    .await?;
    Ok(Admitted::New(run))
}

async fn find_by_idempotency_key(
    conn: &mut PgConnection,
    task_id: &str,
    key: &str,
) -> Result<Option<(RunRecord, serde_json::Value)>> {
    let run: Option<RunRecord> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE task_id = $1 AND idempotency_key = $2"
    )))
    .bind(task_id)
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(run) = run else { return Ok(None) };
    let request: serde_json::Value =
        sqlx::query_scalar("SELECT idempotency_request FROM runs WHERE id = $1")
            .bind(&run.id)
            .fetch_one(conn)
            .await?;
    Ok(Some((run, request)))
}

async fn active_run(conn: &mut PgConnection, task_id: &str) -> Result<Option<String>> {
    let id = sqlx::query_scalar(
        "SELECT id FROM runs WHERE task_id = $1
           AND status IN ('queued', 'running', 'awaiting_approval')",
    )
    .bind(task_id)
    .fetch_optional(conn)
    .await?;
    Ok(id)
}

pub async fn get(conn: &mut PgConnection, task_id: &str, run_id: &str) -> Result<RunRecord> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE task_id = $1 AND id = $2"
    )))
    .bind(task_id)
    .bind(run_id)
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("run"))
}

pub async fn get_by_id(conn: &mut PgConnection, run_id: &str) -> Result<RunRecord> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"
    )))
    .bind(run_id)
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("run"))
}

/// Oldest first; `after` is the id of the last run of the previous page.
pub async fn list(
    conn: &mut PgConnection,
    task_id: &str,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<RunRecord>> {
    let rows = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE task_id = $1 AND ($2::text IS NULL OR id > $2)
         ORDER BY id LIMIT $3"
    )))
    .bind(task_id)
    .bind(after)
    .bind(limit)
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// What a transition records besides the new status.
#[derive(Debug, Clone, Default)]
pub struct Change<'a> {
    pub worker_id: Option<&'a str>,
    pub exit_code: Option<i32>,
    pub last_error: Option<&'a str>,
}

/// Moves a run to `next` if the state machine allows it from the run's current state;
/// otherwise the run is left as it is and the call fails with a conflict.
pub async fn transition(
    conn: &mut PgConnection,
    run_id: &str,
    next: RunStatus,
    change: Change<'_>,
) -> Result<RunRecord> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE runs SET
            status = $2,
            attempt = attempt + CASE WHEN $2 = 'running' THEN 1 ELSE 0 END,
            worker_id = CASE WHEN $2 = 'running' THEN $3 ELSE worker_id END,
            started_at = CASE WHEN $2 = 'running' THEN now() ELSE started_at END,
            finished_at = CASE WHEN $2 IN ('completed', 'failed', 'cancelled') THEN now() END,
            exit_code = COALESCE($4, exit_code),
            last_error = COALESCE($5, last_error),
            updated_at = now()
         WHERE id = $1 AND status = ANY($6)
         RETURNING {RUN_COLUMNS}"
    )))
    .bind(run_id)
    .bind(next.as_str())
    .bind(change.worker_id)
    .bind(change.exit_code)
    .bind(change.last_error)
    .bind(RunStatus::sources_of(next))
    .fetch_optional(conn)
    .await?
    .ok_or_else(|| StoreError::Conflict(format!("run {run_id} cannot become {}", next.as_str())))
}

/// Cancels a run: the terminal state is committed first; the worker holding the job sees
/// its lease vanish and stops the process. Cancelling a finished run returns it unchanged.
pub async fn cancel(conn: &mut PgConnection, task_id: &str, run_id: &str) -> Result<RunRecord> {
    get(conn, task_id, run_id).await?;
    // The job row is locked (deleted) before the run row, the order every worker
    // transaction takes them in, so a cancel and a worker write cannot deadlock.
    queue::remove(conn, queue::RUN_KIND, run_id).await?;
    let run: RunRecord = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE task_id = $1 AND id = $2 FOR UPDATE"
    )))
    .bind(task_id)
    .bind(run_id)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(StoreError::NotFound("run"))?;
    if run.status().is_terminal() {
        return Ok(run);
    }
    let change = Change {
        last_error: Some("cancelled by request"),
        ..Change::default()
    };
    let run = transition(conn, run_id, RunStatus::Cancelled, change).await?;
    close_open_work(conn, run_id, "cancelled", "run cancelled").await?;
    events::append(
        conn,
        &[NewEvent::new(task_id, run_id, EventType::RunCancelled)],
    )
    .await?;
    Ok(run)
}

/// Ends the steps and artifacts an interrupted attempt left open.
pub async fn close_open_work(
    conn: &mut PgConnection,
    run_id: &str,
    step_status: &str,
    reason: &str,
) -> Result<()> {
    sqlx::query(
        "UPDATE steps SET status = $2, error = $3, finished_at = now()
         WHERE run_id = $1 AND status = 'running'",
    )
    .bind(run_id)
    .bind(step_status)
    .bind(reason)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE artifacts SET status = 'complete', updated_at = now()
         WHERE run_id = $1 AND status = 'writing'",
    )
    .bind(run_id)
    .execute(conn)
    .await?;
    Ok(())
}
