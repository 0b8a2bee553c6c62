//! Approvals: per task, the cross-task inbox, and resolution.

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::extract::{ApiJson, ApiQuery};
use super::{ApiError, AppState, list, object, page_limit};
use crate::domain::Actor;
use crate::domain::approval::Decision;
use crate::store::{approvals, tasks};

const STATUSES: [&str; 5] = ["pending", "approved", "rejected", "cancelled", "expired"];

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/approvals", get(inbox))
        .route("/tasks/{task_id}/approvals", get(list_for_task))
        .route(
            "/tasks/{task_id}/approvals/{approval_id}",
            get(get_approval),
        )
        .route(
            "/tasks/{task_id}/approvals/{approval_id}/resolve",
            post(resolve),
        )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalQuery {
    status: Option<String>,
    limit: Option<i64>,
    cursor: Option<String>,
}

impl ApprovalQuery {
    fn status(&self) -> Result<Option<&str>, ApiError> {
        match self.status.as_deref() {
            Some(status) if !STATUSES.contains(&status) => Err(ApiError::invalid(format!(
                "unknown approval status '{status}' (expected one of {})",
                STATUSES.join(", ")
            ))),
            other => Ok(other),
        }
    }
}

async fn inbox(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ApprovalQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(query.limit)?;
    let mut conn = state.pool.acquire().await?;
    let rows = approvals::list(
        &mut conn,
        None,
        query.status()?,
        query.cursor.as_deref(),
        limit + 1,
    )
    .await?;
    Ok(Json(list(rows, limit, |a| a.id.clone())))
}

async fn list_for_task(
    State(state): State<AppState>,
    Path(task_id): Path<String>,
    ApiQuery(query): ApiQuery<ApprovalQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(query.limit)?;
    let mut conn = state.pool.acquire().await?;
    tasks::get(&mut conn, &task_id).await?;
    let rows = approvals::list(
        &mut conn,
        Some(&task_id),
        query.status()?,
        query.cursor.as_deref(),
        limit + 1,
    )
    .await?;
    Ok(Json(list(rows, limit, |a| a.id.clone())))
}

async fn get_approval(
    State(state): State<AppState>,
    Path((task_id, approval_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    Ok(Json(object(
        "task_approval",
        approvals::get(&mut conn, &task_id, &approval_id).await?,
    )))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveRequest {
    decision: Option<String>,
    note: Option<String>,
}

const MAX_NOTE_BYTES: usize = 4096;

async fn resolve(
    State(state): State<AppState>,
    Path((task_id, approval_id)): Path<(String, String)>,
    ApiJson(request): ApiJson<ResolveRequest>,
) -> Result<Json<Value>, ApiError> {
    let decision = request.decision.as_deref().ok_or_else(|| {
        ApiError::from(crate::domain::Invalid::new(
            "decision",
            "is required (approve or reject)",
        ))
    })?;
    let decision = Decision::parse(decision)?;
    if request
        .note
        .as_ref()
        .is_some_and(|n| n.len() > MAX_NOTE_BYTES)
    {
        return Err(crate::domain::Invalid::new(
            "note",
            format!("is longer than {MAX_NOTE_BYTES} bytes"),
        )
        .into());
    }
    let mut tx = state.pool.begin().await?;
    let (approval, run) = approvals::resolve(
        &mut tx,
        &task_id,
        &approval_id,
        decision,
        request.note.as_deref(),
        &Actor::Api,
    )
    .await?;
    tx.commit().await?;
    Ok(Json(object(
        "task_approval",
        json!({ "approval": approval, "run": run }),
    )))
}
