//! Media jobs: the row the API creates and a worker executes through the queue (kind
//! `media`). Every status change goes through [`transition`], guarded by the states
//! [`MediaJobStatus::can_become`] allows, recorded in the audit trail; an attempt that
//! leaves `running` for anything but `succeeded` takes its artifacts with it.

use keel_api_types::ErrorCode;
use sqlx::PgConnection;

use crate::attempt::JobKind;
use crate::db::{Result, StoreError};
use crate::domain::{Actor, EventType, Scope, new_id};
use crate::events;
use crate::events::NewEvent;
use crate::events::transitions;
use crate::events::transitions::Transition;
use crate::media;
use crate::media::{MediaJobStatus, Operation, Unrunnable};
use crate::providers;
use crate::queue;

pub(crate) use keel_api_types::MediaJobRecord;

/// `query_as!` of [`MediaJobRecord`]s: `$before` (up to its `SELECT`), then the columns of
/// job `m` (`status` as a [`MediaJobStatus`]) with its artifacts' ids, then `$after` (its
/// `FROM …`, which names the job `m`).
macro_rules! query_media_jobs {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            MediaJobRecord,
            $before
                + r#" m.id, m.provider_id, m.operation, m.prompt, m.input,
                      m.status AS "status: MediaJobStatus", m.vendor_task_id, m.attempt,
                      m.worker_id, m.last_error_code, m.last_error,
                      ARRAY(SELECT a.id FROM artifacts a WHERE a.media_job_id = m.id
                            ORDER BY a.id) AS "artifact_ids!",
                      m.created_at, m.updated_at, m.started_at, m.finished_at "#
                + $after
            $(, $arg)*
        )
    };
}

/// A media job a request asks for.
pub struct NewMediaJob<'a> {
    pub provider_id: &'a str,
    pub operation: Operation,
    pub prompt: &'a str,
    pub input: &'a serde_json::Value,
}

/// Why a media job was refused: the store error, or what the preset cannot do.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Unrunnable(#[from] Unrunnable),
}

/// Records a queued media job, after checking its preset can run it (seed 000: creation
/// records metadata only; `run` enqueues it).
pub async fn create(
    conn: &mut PgConnection,
    scope: &Scope,
    job: NewMediaJob<'_>,
    actor: &Actor,
) -> Result<MediaJobRecord, Refused> {
    let preset = providers::lock(
        &mut *conn,
        scope,
        job.provider_id,
        providers::LockMode::Share,
    )
    .await?;
    media::check_runnable(
        &preset.id,
        preset.api(),
        preset.enabled,
        &preset.capabilities,
        job.operation,
    )?;
    let id = new_id("media_job");
    sqlx::query!(
        "INSERT INTO media_jobs (id, provider_id, operation, prompt, input, status, workspace_id)
         VALUES ($1, $2, $3, $4, $5, 'queued', $6)",
        &id,
        job.provider_id,
        job.operation.as_str(),
        job.prompt,
        job.input,
        scope.workspace(),
    )
    .execute(&mut *conn)
    .await
    .map_err(StoreError::from)?;
    audit(
        conn,
        scope,
        &id,
        None,
        MediaJobStatus::Queued,
        actor,
        Some("created"),
    )
    .await?;
    Ok(get(conn, scope, &id).await?)
}

pub async fn get(conn: &mut PgConnection, scope: &Scope, id: &str) -> Result<MediaJobRecord> {
    query_media_jobs!(
        "SELECT",
        "FROM media_jobs m WHERE m.workspace_id = $1 AND m.id = $2",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("media job"))
}

/// Reads the job under a row lock: every status change and fenced worker write takes it.
pub(crate) async fn lock(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<MediaJobRecord> {
    query_media_jobs!(
        "SELECT",
        "FROM media_jobs m WHERE m.workspace_id = $1 AND m.id = $2 FOR UPDATE OF m",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("media job"))
}

#[derive(Debug, Default)]
pub struct ListFilter {
    pub(crate) status: Option<MediaJobStatus>,
    pub(crate) provider_id: Option<String>,
}

pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    filter: &ListFilter,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<MediaJobRecord>> {
    let rows = query_media_jobs!(
        "SELECT",
        "FROM media_jobs m
         WHERE m.workspace_id = $5 AND ($1::text IS NULL OR m.status = $1)
           AND ($2::text IS NULL OR m.provider_id = $2)
           AND m.id > $3
         ORDER BY m.id LIMIT $4",
        filter.status.map(MediaJobStatus::as_str),
        filter.provider_id.as_deref(),
        // Every id is greater than '': the first page's bound is an index bound too.
        after.unwrap_or_default(),
        limit,
        scope.workspace(),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// What a transition changes besides the status.
#[derive(Debug, Default)]
pub struct Change<'a> {
    pub(crate) worker_id: Option<&'a str>,
    /// `(code, message)` of a failure; cleared by any transition without one.
    pub(crate) error: Option<(&'a str, &'a str)>,
}

/// Moves the job to `next` if its current state allows it; the one status write.
pub async fn transition(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    next: MediaJobStatus,
    change: Change<'_>,
    actor: &Actor,
    reason: Option<&str>,
) -> Result<MediaJobRecord> {
    let current = lock(conn, scope, id).await?;
    if !current.status().can_become(next) {
        return Err(StoreError::conflict_next(
            format!(
                "media job {id} is {}; it cannot become {}",
                current.status,
                next.as_str()
            ),
            format!("See where the job stands: keel media show {id}."),
        ));
    }
    let (code, message) = change.error.unzip();
    sqlx::query!(
        "UPDATE media_jobs SET status = $2, updated_at = now(),
             attempt = attempt + CASE WHEN $2 = 'running' THEN 1 ELSE 0 END,
             worker_id = COALESCE($3, worker_id),
             started_at = CASE WHEN $2 = 'running' THEN now() ELSE started_at END,
             finished_at = CASE WHEN $2 IN ('succeeded', 'failed', 'cancelled') THEN now() END,
             -- A job run again after it ended starts over at the vendor.
             vendor_task_id = CASE WHEN status IN ('failed', 'cancelled') THEN NULL
                                   ELSE vendor_task_id END,
             last_error_code = $4, last_error = $5
         WHERE workspace_id = $6 AND id = $1",
        id,
        next.as_str(),
        change.worker_id,
        code,
        message,
        scope.workspace(),
    )
    .execute(&mut *conn)
    .await?;
    if current.status() == MediaJobStatus::Running && next != MediaJobStatus::Succeeded {
        discard_artifacts(conn, scope, id).await?;
    }
    audit(conn, scope, id, Some(current.status()), next, actor, reason).await?;
    get(conn, scope, id).await
}

/// Removes what an attempt that did not succeed (failed, retried, cancelled, taken over)
/// wrote, complete or not: a job that did not succeed has no result to serve, and the next
/// attempt writes every result anew, never after a cut download's bytes. Their chunks go
/// with them (ON DELETE CASCADE), and their bytes leave the workspace's count; an S3
/// chunk's object stays behind, pointed at by no row, as a rolled-back append's does.
async fn discard_artifacts(conn: &mut PgConnection, scope: &Scope, id: &str) -> Result<()> {
    sqlx::query!(
        "DELETE FROM artifacts WHERE workspace_id = $1 AND media_job_id = $2",
        scope.workspace(),
        id,
    )
    .execute(conn)
    .await?;
    Ok(())
}

async fn audit(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    from: Option<MediaJobStatus>,
    to: MediaJobStatus,
    actor: &Actor,
    reason: Option<&str>,
) -> Result<()> {
    let change = Transition {
        entity_type: "media_job",
        entity_id: id,
        task_id: None,
        from: from.map(MediaJobStatus::as_str),
        to: to.as_str(),
        reason,
    };
    transitions::record(conn, scope, change, actor).await
}

/// Enqueues the job (`POST /media-jobs/{id}/run`): from `queued` (again a no-op if its
/// queue row exists), `failed` or `cancelled`. The preset must still be able to run it.
pub async fn run(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    actor: &Actor,
) -> Result<MediaJobRecord, Refused> {
    let job = lock(conn, scope, id).await?;
    if !job.status().is_runnable() {
        return Err(StoreError::Refused {
            code: ErrorCode::MediaJobNotRunnable,
            message: format!(
                "media job {id} is {}; only queued, failed or cancelled jobs run",
                job.status
            ),
        }
        .into());
    }
    let preset = providers::lock(
        &mut *conn,
        scope,
        &job.provider_id,
        providers::LockMode::Share,
    )
    .await?;
    let operation = Operation::parse(&job.operation).expect("the table's check constraint");
    media::check_runnable(
        &preset.id,
        preset.api(),
        preset.enabled,
        &preset.capabilities,
        operation,
    )?;
    if job.status() != MediaJobStatus::Queued {
        let reason = Some("run again");
        transition(
            conn,
            scope,
            id,
            MediaJobStatus::Queued,
            Change::default(),
            actor,
            reason,
        )
        .await?;
    }
    queue::enqueue(conn, scope, JobKind::Media.as_str(), id, 0)
        .await
        .map_err(StoreError::from)?;
    let data = serde_json::json!({ "actor": actor.to_string() });
    let queued = NewEvent::media_job(id, EventType::MediaJobQueued).with(data);
    events::append(conn, scope, &[queued]).await?;
    Ok(get(conn, scope, id).await?)
}

/// Cancels a queued or running job; an ended job is returned as it is. Takes the queue row
/// and the job row in the order workers do (see `runs::cancel`).
pub async fn cancel(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    actor: &Actor,
) -> Result<MediaJobRecord> {
    get(conn, scope, id).await?;
    queue::remove(
        conn,
        scope,
        JobKind::Media.as_str(),
        id,
        queue::Locked::Wait,
    )
    .await?;
    let job = lock(conn, scope, id).await?;
    if job.status().is_terminal() {
        return Ok(job);
    }
    let reason = Some("cancelled by request");
    let job = transition(
        conn,
        scope,
        id,
        MediaJobStatus::Cancelled,
        Change::default(),
        actor,
        reason,
    )
    .await?;
    queue::remove(
        conn,
        scope,
        JobKind::Media.as_str(),
        id,
        queue::Locked::Skip,
    )
    .await?;
    let data = serde_json::json!({ "actor": actor.to_string() });
    events::append(
        conn,
        scope,
        &[NewEvent::media_job(id, EventType::MediaJobCancelled).with(data)],
    )
    .await?;
    Ok(job)
}

/// Records the vendor's task id before the worker polls it, in the worker's fenced
/// transaction: a worker that takes the job over resumes that task.
pub(crate) async fn save_vendor_task(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    task_id: &str,
) -> Result<()> {
    sqlx::query!(
        "UPDATE media_jobs SET vendor_task_id = $2, updated_at = now()
         WHERE workspace_id = $3 AND id = $1",
        id,
        task_id,
        scope.workspace(),
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Puts a running job whose worker is gone back to `queued`, in the caller's transaction;
/// returns the queued job and its event, for the caller to append last.
pub(crate) async fn requeue_lost<'r>(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &'r str,
    reason: &str,
    actor: &Actor,
) -> Result<(MediaJobRecord, NewEvent<'r>)> {
    let (queued, change) = (MediaJobStatus::Queued, Change::default());
    let record = transition(conn, scope, id, queued, change, actor, Some(reason)).await?;
    let data = serde_json::json!({ "reason": reason });
    Ok((
        record,
        NewEvent::media_job(id, EventType::MediaJobQueued).with(data),
    ))
}
