//! Tasks, runs, steps and artifacts.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use keel_api_types::Deleted;
use keel_api_types::{ListOrder, RunContextPacket, RunTranscript, StartRequest};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::agent::{context, transcript};
use crate::api::admission::{Admitted201, admit};
use crate::api::extract::{ApiJson, ApiQuery, OptionalJson};
use crate::api::{
    ApiError, AppState, ContentQuery, ListEnvelope, ObjectEnvelope, PageQuery, list, list_order,
    object, page_limit,
};
use crate::artifacts::ArtifactRecord;
use crate::domain::{Caller, RunStatus};
use crate::events::Subject;
use crate::runs::steps;
use crate::runs::steps::StepRecord;
use crate::runs::{Admission, Origin, RunFilter, RunRecord};
use crate::tasks::TaskDraft;
use crate::tasks::TaskRecord;
use crate::tasks::{NewTask, TaskStatus};
use crate::{artifacts, runs, tasks};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_task, list_tasks))
        .routes(routes!(get_task, delete_task))
        .routes(routes!(start_task))
        .routes(routes!(list_workspace_runs))
        .routes(routes!(list_runs))
        .routes(routes!(get_run))
        .routes(routes!(retry_run))
        .routes(routes!(resume_run))
        .merge(crate::api::lineage::router())
        .routes(routes!(cancel_run))
        .routes(routes!(list_steps))
        .routes(routes!(get_step))
        .routes(routes!(get_transcript))
        .routes(routes!(get_run_context))
        .routes(routes!(list_task_artifacts))
        .routes(routes!(list_artifacts))
        .routes(routes!(get_artifact))
        .routes(routes!(artifact_content))
}

type Result<T> = std::result::Result<T, ApiError>;

/// Creates a task: durable execution intent. Nothing is queued until it is started, here
/// with `start: true` or later by `POST /v1/tasks/{task_id}/start`.
#[utoipa::path(post, path = "/tasks", tag = "tasks", request_body = TaskDraft,
    responses((status = 201, description = "The new task: `not_started`, or with `start` its first run's status and `latest_run_id`", body = ObjectEnvelope<TaskRecord>)))]
async fn create_task(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(draft): ApiJson<TaskDraft>,
) -> Result<(StatusCode, Json<ObjectEnvelope<TaskRecord>>)> {
    let start = draft.start.unwrap_or(false);
    let mut task = NewTask::parse(draft, &state.rules.timeouts)?;
    if !caller.is_local() {
        task.confine_to_tenant(&state.rules.workspace_roots, &caller.scope)?;
    }
    task.check_workspace(&state.rules.workspace_roots)?;
    let rules = (&*state.secrets, &*state.provider_hosts);
    task.written_as(caller.role, rules, caller.scope.workspace())?;
    task.check_commands(&state.rules.mcp_stdio_commands)
        .map_err(ApiError::Forbidden)?;
    let (scope, actor) = (&caller.scope, &caller.actor());
    let task = if start {
        // One commit for both: the task never exists without the run it was created for.
        // Created in this transaction, it is locked already and its hooks are known.
        let mut tx = state.pool.begin().await?;
        let record = tasks::insert(&mut tx, scope, &task, actor).await?;
        let locked = (record.clone(), task.hooks.clone());
        let admission = Admission::new(Origin::Start);
        let admitted =
            runs::admit_locked(&mut tx, scope, locked, admission, &state.rules, actor).await?;
        tx.commit().await?;
        started_with(record, admitted.run())
    } else {
        let mut conn = state.pool.acquire().await?;
        tasks::insert(&mut conn, scope, &task, actor).await?
    };
    Ok((StatusCode::CREATED, Json(object("task", task))))
}

/// A task created in the admitting transaction, as that transaction left it: what
/// `tasks::get` would read after the commit (its run's status, one run, no steps or
/// artifacts yet; `now()` is the transaction's, so `updated_at` is `created_at`).
fn started_with(task: TaskRecord, run: &RunRecord) -> TaskRecord {
    TaskRecord {
        status: TaskStatus::from(run.status()),
        run_count: 1,
        latest_run_id: Some(run.id.clone()),
        ..task
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct TaskListQuery {
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
    /// `not_started` or a run status.
    #[param(value_type = Option<TaskStatus>, inline)]
    status: Option<String>,
}

/// Lists tasks, newest first.
#[utoipa::path(get, path = "/tasks", tag = "tasks", params(TaskListQuery),
    responses((status = 200, description = "A page of tasks", body = ListEnvelope<TaskRecord>)))]
async fn list_tasks(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<TaskListQuery>,
) -> Result<Json<ListEnvelope<TaskRecord>>> {
    let limit = page_limit(query.limit)?;
    let status = match query.status.as_deref() {
        None => None,
        Some(value) => Some(TaskStatus::parse(value).ok_or_else(|| {
            ApiError::invalid(format!(
                "unknown status '{value}' (expected not_started, queued, running, \
                 awaiting_approval, completed, failed or cancelled)"
            ))
        })?),
    };
    let mut conn = state.pool.acquire().await?;
    let cursor = query.cursor.as_deref();
    let rows = tasks::list(&mut conn, &caller.scope, status, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |t| t.id.clone())))
}

/// Reads a task with its latest-run projection.
#[utoipa::path(get, path = "/tasks/{task_id}", tag = "tasks", params(("task_id" = String, Path)),
    responses((status = 200, description = "The task", body = ObjectEnvelope<TaskRecord>)))]
async fn get_task(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
) -> Result<Json<ObjectEnvelope<TaskRecord>>> {
    let mut conn = state.pool.acquire().await?;
    let task = tasks::get(&mut conn, &caller.scope, &task_id).await?;
    Ok(Json(object("task", task)))
}

/// Deletes a task with its runs, steps, artifacts and events; 409 while a run is active.
#[utoipa::path(delete, path = "/tasks/{task_id}", tag = "tasks", params(("task_id" = String, Path)),
    responses((status = 200, description = "The task is gone", body = Deleted)))]
async fn delete_task(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
) -> Result<Json<Deleted>> {
    let mut tx = state.pool.begin().await?;
    tasks::delete(&mut tx, &caller.scope, &task_id, &caller.actor()).await?;
    tx.commit().await?;
    Ok(Json(Deleted {
        object: "task".to_string(),
        id: task_id,
        deleted: true,
    }))
}

/// Starts the task: creates its next run, queued (or awaiting approval), in one transaction.
#[utoipa::path(post, path = "/tasks/{task_id}/start", tag = "runs", request_body(content = Option<StartRequest>),
    params(("task_id" = String, Path), ("Idempotency-Key" = Option<String>, Header, pattern = "^[!-~]{1,255}$", description = "Replays return the original run")),
    responses((status = 201, description = "The new run", body = ObjectEnvelope<RunRecord>),
              (status = 200, description = "The run an earlier request with this Idempotency-Key created", body = ObjectEnvelope<RunRecord>)))]
async fn start_task(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
    headers: HeaderMap,
    OptionalJson(request): OptionalJson<StartRequest>,
) -> Result<Admitted201> {
    admit(
        &state,
        &caller,
        &task_id,
        Origin::Start,
        &headers,
        request,
        None,
    )
    .await
}

/// Retries: a new run of the task in a fresh workspace, linked to the source run.
#[utoipa::path(post, path = "/tasks/{task_id}/runs/{run_id}/retry", tag = "runs", request_body(content = Option<StartRequest>),
    params(("task_id" = String, Path), ("run_id" = String, Path), ("Idempotency-Key" = Option<String>, Header, pattern = "^[!-~]{1,255}$")),
    responses((status = 201, description = "The new run", body = ObjectEnvelope<RunRecord>),
              (status = 200, description = "A replayed request's run", body = ObjectEnvelope<RunRecord>)))]
async fn retry_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
    headers: HeaderMap,
    OptionalJson(request): OptionalJson<StartRequest>,
) -> Result<Admitted201> {
    let origin = Origin::Retry(run_id);
    admit(&state, &caller, &task_id, origin, &headers, request, None).await
}

/// Resumes a finished run: a new run in its workspace, with its checkpoint and cost; an
/// agent loop run's conversation carries on from its `agent_conversation` artifact.
#[utoipa::path(post, path = "/tasks/{task_id}/runs/{run_id}/resume", tag = "runs", request_body(content = Option<StartRequest>),
    params(("task_id" = String, Path), ("run_id" = String, Path), ("Idempotency-Key" = Option<String>, Header, pattern = "^[!-~]{1,255}$")),
    responses((status = 201, description = "The new run", body = ObjectEnvelope<RunRecord>),
              (status = 200, description = "A replayed request's run", body = ObjectEnvelope<RunRecord>)))]
async fn resume_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
    headers: HeaderMap,
    OptionalJson(request): OptionalJson<StartRequest>,
) -> Result<Admitted201> {
    let base = crate::api::lineage::resume_base(&state, &caller, &task_id, &run_id).await?;
    let origin = Origin::Resume(run_id);
    admit(&state, &caller, &task_id, origin, &headers, request, base).await
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct RunListQuery {
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
    /// Only runs in this status.
    #[param(value_type = Option<RunStatus>, inline)]
    status: Option<String>,
    /// Only this task's runs.
    task_id: Option<String>,
    /// `asc`, oldest first (the default), or `desc`, newest first; the cursor pages on in
    /// the same order.
    #[param(value_type = Option<ListOrder>, inline)]
    order: Option<String>,
}

impl RunListQuery {
    fn filter(&self) -> Result<RunFilter<'_>> {
        let status = match self.status.as_deref() {
            None => None,
            Some(value) => Some(RunStatus::parse(value).ok_or_else(|| {
                let names: Vec<&str> = RunStatus::ALL.map(RunStatus::as_str).to_vec();
                ApiError::invalid(format!(
                    "unknown status '{value}' (expected {})",
                    names.join(", ")
                ))
            })?),
        };
        let task_id = self.task_id.as_deref();
        Ok(RunFilter { status, task_id })
    }

    fn order(&self) -> Result<ListOrder> {
        list_order(self.order.as_deref())
    }
}

/// Lists the runs of every task in the workspace, oldest first, or newest first with
/// `order=desc` (a task's runs as `GET /v1/tasks/{task_id}/runs` pages them).
#[utoipa::path(get, path = "/runs", tag = "runs", params(RunListQuery),
    responses((status = 200, description = "A page of runs", body = ListEnvelope<RunRecord>)))]
async fn list_workspace_runs(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<RunListQuery>,
) -> Result<Json<ListEnvelope<RunRecord>>> {
    let limit = page_limit(query.limit)?;
    let (filter, order) = (query.filter()?, query.order()?);
    let mut conn = state.pool.acquire().await?;
    let page = (order, query.cursor.as_deref());
    let rows = runs::list_in_workspace(&mut conn, &caller.scope, filter, page, limit + 1).await?;
    Ok(Json(list(rows, limit, |r| r.id.clone())))
}

/// Lists a task's runs, oldest first.
#[utoipa::path(get, path = "/tasks/{task_id}/runs", tag = "runs", params(("task_id" = String, Path), PageQuery),
    responses((status = 200, description = "A page of runs", body = ListEnvelope<RunRecord>)))]
async fn list_runs(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<ListEnvelope<RunRecord>>> {
    let limit = page_limit(page.limit)?;
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    tasks::get(&mut conn, scope, &task_id).await?;
    let rows = runs::list(
        &mut conn,
        scope,
        &task_id,
        page.cursor.as_deref(),
        limit + 1,
    )
    .await?;
    Ok(Json(list(rows, limit, |r| r.id.clone())))
}

/// Reads a run.
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path)),
    responses((status = 200, description = "The run", body = ObjectEnvelope<RunRecord>)))]
async fn get_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
) -> Result<Json<ObjectEnvelope<RunRecord>>> {
    let mut conn = state.pool.acquire().await?;
    let run = runs::get(&mut conn, &caller.scope, &task_id, &run_id).await?;
    Ok(Json(object("task_run", run)))
}

/// Cancels a run: `cancelled` is committed first, then the worker stops its process tree.
/// Cancelling a finished run returns it unchanged.
#[utoipa::path(post, path = "/tasks/{task_id}/runs/{run_id}/cancel", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path)),
    responses((status = 200, description = "The run", body = ObjectEnvelope<RunRecord>)))]
async fn cancel_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
) -> Result<Json<ObjectEnvelope<RunRecord>>> {
    let mut tx = state.pool.begin().await?;
    let (scope, actor) = (&caller.scope, &caller.actor());
    let run = runs::cancel(&mut tx, scope, &task_id, &run_id, actor).await?;
    tx.commit().await?;
    Ok(Json(object("task_run", run)))
}

/// Lists a run's steps in order; the cursor is a step index.
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}/steps", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path), ("limit" = Option<i64>, Query, minimum = 1, maximum = 200, description = "Page size, 1 to 200 (default 50)"),
           ("cursor" = Option<String>, Query, pattern = "^[0-9]{1,9}$", description = "`next_cursor` of the previous page: a step index")),
    responses((status = 200, description = "A page of steps", body = ListEnvelope<StepRecord>)))]
async fn list_steps(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<ListEnvelope<StepRecord>>> {
    let limit = page_limit(page.limit)?;
    let after: i32 = match page.cursor.as_deref() {
        None => 0,
        Some(cursor) => Some(cursor)
            .filter(|c| (1..=9).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| ApiError::invalid("cursor must be a step index"))?,
    };
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    runs::get(&mut conn, scope, &task_id, &run_id).await?;
    let rows = steps::list(&mut conn, scope, &run_id, after, limit + 1).await?;
    Ok(Json(list(rows, limit, |s| s.index.to_string())))
}

/// Reads one of a run's steps.
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}/steps/{step_id}", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path), ("step_id" = String, Path)),
    responses((status = 200, description = "The step", body = ObjectEnvelope<StepRecord>)))]
async fn get_step(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id, step_id)): Path<(String, String, String)>,
) -> Result<Json<ObjectEnvelope<StepRecord>>> {
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    runs::get(&mut conn, scope, &task_id, &run_id).await?;
    let step = steps::get(&mut conn, scope, &run_id, &step_id).await?;
    Ok(Json(object("task_step", step)))
}

/// Reads an agent loop run as its transcript: the prompt, each model call's text with its
/// tokens, cost and latency, each tool call with its arguments and an abridged result,
/// the approvals and file changes, in order; `sequence` is the run's last event it
/// reflects. 422 `unsupported_capability` for a run of another kind.
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}/transcript", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path)),
    responses((status = 200, description = "The run's transcript", body = ObjectEnvelope<RunTranscript>)))]
async fn get_transcript(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
) -> Result<Json<ObjectEnvelope<RunTranscript>>> {
    let scope = &caller.scope;
    let transcript = transcript::read_snapshot(&state.pool, scope, &task_id, &run_id).await?;
    Ok(Json(object("run_transcript", transcript)))
}

/// The prompt layers an agent loop run started from (seed 004's context packet): the
/// runtime's, the workspace's and the task's system prompts, in order, the message it
/// started from, and how many earlier turns it carries. 422 `unsupported_capability` for
/// a run of another kind.
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}/context", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path)),
    responses((status = 200, description = "The run's context", body = ObjectEnvelope<RunContextPacket>)))]
async fn get_run_context(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
) -> Result<Json<ObjectEnvelope<RunContextPacket>>> {
    let mut conn = state.pool.acquire().await?;
    let packet = context::read(&mut conn, &caller.scope, &task_id, &run_id).await?;
    Ok(Json(object("run_context", packet)))
}

/// Lists the artifacts of all the task's runs, oldest first.
#[utoipa::path(get, path = "/tasks/{task_id}/artifacts", tag = "runs",
    params(("task_id" = String, Path), PageQuery),
    responses((status = 200, description = "A page of artifacts", body = ListEnvelope<ArtifactRecord>)))]
async fn list_task_artifacts(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<ListEnvelope<ArtifactRecord>>> {
    let limit = page_limit(page.limit)?;
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    tasks::get(&mut conn, scope, &task_id).await?;
    let cursor = page.cursor.as_deref();
    let rows = artifacts::list_of_task(&mut conn, scope, &task_id, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |a| a.id.clone())))
}

/// Lists a run's artifacts (its stdout and stderr).
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}/artifacts", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path), PageQuery),
    responses((status = 200, description = "A page of artifacts", body = ListEnvelope<ArtifactRecord>)))]
async fn list_artifacts(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<ListEnvelope<ArtifactRecord>>> {
    let limit = page_limit(page.limit)?;
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    runs::get(&mut conn, scope, &task_id, &run_id).await?;
    let owner = run_subject(&task_id, &run_id);
    let cursor = page.cursor.as_deref();
    let rows = artifacts::list(&mut conn, scope, owner, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |a| a.id.clone())))
}

/// Reads an artifact's metadata.
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}/artifacts/{artifact_id}", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path), ("artifact_id" = String, Path)),
    responses((status = 200, description = "The artifact", body = ObjectEnvelope<ArtifactRecord>)))]
async fn get_artifact(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id, artifact_id)): Path<(String, String, String)>,
) -> Result<Json<ObjectEnvelope<ArtifactRecord>>> {
    let mut conn = state.pool.acquire().await?;
    let artifact = run_artifact(&mut conn, &caller, &task_id, &run_id, &artifact_id).await?;
    Ok(Json(object("task_artifact", artifact)))
}

/// The artifact's bytes so far (after `offset`); readable while the run is still writing
/// them.
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}/artifacts/{artifact_id}/content", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path), ("artifact_id" = String, Path), ContentQuery),
    responses((status = 200, description = "The bytes", content_type = "text/plain", body = String)))]
async fn artifact_content(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id, artifact_id)): Path<(String, String, String)>,
    ApiQuery(query): ApiQuery<ContentQuery>,
) -> Result<Response> {
    let mut conn = state.pool.acquire().await?;
    let artifact = run_artifact(&mut conn, &caller, &task_id, &run_id, &artifact_id).await?;
    drop(conn);
    crate::api::artifact_body(&state, artifact, query).await
}

/// A run's artifact, in the caller's workspace.
async fn run_artifact(
    conn: &mut sqlx::PgConnection,
    caller: &Caller,
    task_id: &str,
    run_id: &str,
    artifact_id: &str,
) -> Result<ArtifactRecord> {
    let scope = &caller.scope;
    runs::get(conn, scope, task_id, run_id).await?;
    let owner = run_subject(task_id, run_id);
    Ok(artifacts::get(conn, scope, owner, artifact_id).await?)
}

fn run_subject<'a>(task_id: &'a str, run_id: &'a str) -> Subject<'a> {
    Subject::Run { task_id, run_id }
}
