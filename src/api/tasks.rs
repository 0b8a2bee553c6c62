//! Tasks, runs, steps and artifacts.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

use super::extract::{ApiJson, ApiQuery, OptionalJson};
use super::{ApiError, AppState, PageQuery, list, object, page_limit};
use crate::domain::task::TaskDraft;
use crate::domain::{NewTask, TaskStatus};
use crate::store::runs::{Admission, Admitted};
use crate::store::{artifacts, runs, steps, tasks};

const IDEMPOTENCY_KEY: &str = "idempotency-key";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/tasks", post(create_task).get(list_tasks))
        .route("/tasks/{task_id}", get(get_task).delete(delete_task))
        .route("/tasks/{task_id}/start", post(start_task))
        .route("/tasks/{task_id}/runs", get(list_runs))
        .route("/tasks/{task_id}/runs/{run_id}", get(get_run))
        .route("/tasks/{task_id}/runs/{run_id}/retry", post(retry_run))
        .route("/tasks/{task_id}/runs/{run_id}/cancel", post(cancel_run))
        .route("/tasks/{task_id}/runs/{run_id}/steps", get(list_steps))
        .route(
            "/tasks/{task_id}/runs/{run_id}/artifacts",
            get(list_artifacts),
        )
        .route(
            "/tasks/{task_id}/runs/{run_id}/artifacts/{artifact_id}",
            get(get_artifact),
        )
        .route(
            "/tasks/{task_id}/runs/{run_id}/artifacts/{artifact_id}/content",
            get(artifact_content),
        )
}

async fn create_task(
    State(state): State<AppState>,
    ApiJson(draft): ApiJson<TaskDraft>,
) -> Result<impl IntoResponse, ApiError> {
    let task = NewTask::parse(draft)?;
    let mut conn = state.pool.acquire().await?;
    let task = tasks::insert(&mut conn, &task).await?;
    Ok((StatusCode::CREATED, Json(object("task", task))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskListQuery {
    limit: Option<i64>,
    cursor: Option<String>,
    status: Option<String>,
}

async fn list_tasks(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<TaskListQuery>,
) -> Result<Json<Value>, ApiError> {
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
    let rows = tasks::list(&mut conn, status, query.cursor.as_deref(), limit + 1).await?;
    Ok(Json(list(rows, limit, |t| t.id.clone())))
}

async fn get_task(
    State(state): State<AppState>,
    Path(task_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    Ok(Json(object("task", tasks::get(&mut conn, &task_id).await?)))
}

async fn delete_task(
    State(state): State<AppState>,
    Path(task_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let mut tx = state.pool.begin().await?;
    tasks::delete(&mut tx, &task_id).await?;
    tx.commit().await?;
    Ok(Json(
        serde_json::json!({ "object": "task", "id": task_id, "deleted": true }),
    ))
}

/// Optional body of start and retry.
#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct StartRequest {
    reason: Option<String>,
}

async fn start_task(
    State(state): State<AppState>,
    Path(task_id): Path<String>,
    headers: HeaderMap,
    OptionalJson(request): OptionalJson<StartRequest>,
) -> Result<Response, ApiError> {
    admit(&state, &task_id, None, &headers, "start", request).await
}

async fn retry_run(
    State(state): State<AppState>,
    Path((task_id, run_id)): Path<(String, String)>,
    headers: HeaderMap,
    OptionalJson(request): OptionalJson<StartRequest>,
) -> Result<Response, ApiError> {
    admit(&state, &task_id, Some(run_id), &headers, "retry", request).await
}

/// Start and retry: one transaction that creates the run, enqueues it and records its
/// events. A replayed `Idempotency-Key` returns the original run with 200.
async fn admit(
    state: &AppState,
    task_id: &str,
    retried_from: Option<String>,
    headers: &HeaderMap,
    action: &str,
    request: StartRequest,
) -> Result<Response, ApiError> {
    let idempotency = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(value) => {
            let key = value
                .to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= 255)
                .ok_or_else(|| {
                    ApiError::invalid("Idempotency-Key must be 1 to 255 visible ASCII characters")
                })?;
            let fingerprint = serde_json::json!({
                "action": action, "retried_from": retried_from, "body": request,
            });
            Some((key.to_string(), fingerprint))
        }
    };
    let admission = Admission {
        retried_from,
        idempotency,
        schedule: None,
    };
    let mut tx = state.pool.begin().await?;
    let admitted = runs::admit(&mut tx, task_id, admission).await?;
    tx.commit().await?;
    Ok(match admitted {
        Admitted::New(run) => (StatusCode::CREATED, Json(object("task_run", run))).into_response(),
        Admitted::Replayed(run) => (StatusCode::OK, Json(object("task_run", run))).into_response(),
    })
}

async fn list_runs(
    State(state): State<AppState>,
    Path(task_id): Path<String>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(page.limit)?;
    let mut conn = state.pool.acquire().await?;
    tasks::get(&mut conn, &task_id).await?;
    let rows = runs::list(&mut conn, &task_id, page.cursor.as_deref(), limit + 1).await?;
    Ok(Json(list(rows, limit, |r| r.id.clone())))
}

async fn get_run(
    State(state): State<AppState>,
    Path((task_id, run_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    Ok(Json(object(
        "task_run",
        runs::get(&mut conn, &task_id, &run_id).await?,
    )))
}

async fn cancel_run(
    State(state): State<AppState>,
    Path((task_id, run_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut tx = state.pool.begin().await?;
    let run = runs::cancel(&mut tx, &task_id, &run_id).await?;
    tx.commit().await?;
    Ok(Json(object("task_run", run)))
}

async fn list_steps(
    State(state): State<AppState>,
    Path((task_id, run_id)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(page.limit)?;
    let after: i32 = match page.cursor.as_deref() {
        None => 0,
        Some(cursor) => cursor
            .parse()
            .map_err(|_| ApiError::invalid("cursor must be a step index"))?,
    };
    let mut conn = state.pool.acquire().await?;
    runs::get(&mut conn, &task_id, &run_id).await?;
    let rows = steps::list(&mut conn, &run_id, after, limit + 1).await?;
    Ok(Json(list(rows, limit, |s| s.index.to_string())))
}

async fn list_artifacts(
    State(state): State<AppState>,
    Path((task_id, run_id)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(page.limit)?;
    let mut conn = state.pool.acquire().await?;
    runs::get(&mut conn, &task_id, &run_id).await?;
    let rows = artifacts::list(&mut conn, &run_id, page.cursor.as_deref(), limit + 1).await?;
    Ok(Json(list(rows, limit, |a| a.id.clone())))
}

async fn get_artifact(
    State(state): State<AppState>,
    Path((task_id, run_id, artifact_id)): Path<(String, String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    runs::get(&mut conn, &task_id, &run_id).await?;
    Ok(Json(object(
        "task_artifact",
        artifacts::get(&mut conn, &run_id, &artifact_id).await?,
    )))
}

/// The artifact's bytes so far; readable while the run is still writing them.
async fn artifact_content(
    State(state): State<AppState>,
    Path((task_id, run_id, artifact_id)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let mut conn = state.pool.acquire().await?;
    runs::get(&mut conn, &task_id, &run_id).await?;
    let artifact = artifacts::get(&mut conn, &run_id, &artifact_id).await?;
    let bytes = artifacts::read_content(&mut conn, &artifact.id).await?;
    Ok(([(header::CONTENT_TYPE, artifact.content_type)], bytes).into_response())
}
