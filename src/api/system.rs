//! Health, readiness and system stats.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::extract::ApiQuery;
use super::{ApiError, AppState, list, object, page_limit};
use crate::store::leases::{self, LeaseStatus};
use crate::store::{self, stats, transitions};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// A worker is live while its registry heartbeat is younger than this.
const WORKER_LIVE_MS: i64 = 30_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

pub fn v1_router() -> Router<AppState> {
    Router::new()
        .route("/system/stats", get(system_stats))
        .route("/state-transitions", get(state_transitions))
        .route("/runtime/leases", get(runtime_leases))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransitionQuery {
    entity_type: Option<String>,
    entity_id: Option<String>,
    limit: Option<i64>,
    cursor: Option<String>,
}

fn numeric_cursor(cursor: Option<&str>) -> Result<i64, ApiError> {
    match cursor {
        None => Ok(0),
        Some(c) => c
            .parse()
            .ok()
            .filter(|n: &i64| *n >= 0)
            .ok_or_else(|| ApiError::invalid("cursor must be a number from a previous page")),
    }
}

/// The audit trail, oldest first, optionally of one entity.
async fn state_transitions(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<TransitionQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(query.limit)?;
    if let Some(kind) = query
        .entity_type
        .as_deref()
        .filter(|k| !["task", "run", "approval"].contains(k))
    {
        return Err(ApiError::invalid(format!(
            "unknown entity_type '{kind}' (expected task, run or approval)"
        )));
    }
    let after = numeric_cursor(query.cursor.as_deref())?;
    let mut conn = state.pool.acquire().await?;
    let rows = transitions::list(
        &mut conn,
        query.entity_type.as_deref(),
        query.entity_id.as_deref(),
        after,
        limit + 1,
    )
    .await?;
    Ok(Json(list(rows, limit, |t| t.id.to_string())))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseQuery {
    status: Option<String>,
    limit: Option<i64>,
    cursor: Option<String>,
}

/// Queue leases: `active` (default), `expired` (not yet reclaimed) or `released`.
async fn runtime_leases(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<LeaseQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(query.limit)?;
    let status = query.status.as_deref().unwrap_or("active");
    let status = LeaseStatus::parse(status).ok_or_else(|| {
        ApiError::invalid(format!(
            "unknown lease status '{status}' (expected active, released or expired)"
        ))
    })?;
    let after = numeric_cursor(query.cursor.as_deref())?;
    let mut conn = state.pool.acquire().await?;
    let rows = leases::list(&mut conn, status, after, limit + 1).await?;
    let cursors: Vec<i64> = rows.iter().map(|(cursor, _)| *cursor).collect();
    let leases: Vec<_> = rows.into_iter().map(|(_, lease)| lease).collect();
    let mut page = list(leases, limit, |_| String::new());
    if page["has_more"] == true {
        page["next_cursor"] = cursors[limit as usize - 1].to_string().into();
    }
    Ok(Json(page))
}

/// Liveness: touches nothing.
async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok", "time": chrono::Utc::now(), "version": VERSION }))
}

/// Readiness: the database answers and has every migration this binary needs.
async fn readyz(State(state): State<AppState>) -> Response {
    let (status, database, migrations) = match store::migrations_current(&state.pool).await {
        Ok(true) => (StatusCode::OK, "ok", "current"),
        Ok(false) => (StatusCode::SERVICE_UNAVAILABLE, "ok", "pending"),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "unreachable", "unknown"),
    };
    let body = json!({
        "status": if status == StatusCode::OK { "ready" } else { "not_ready" },
        "database": database,
        "migrations": migrations,
    });
    (status, Json(body)).into_response()
}

async fn system_stats(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let queue = stats::queue(&mut conn).await?;
    let workers = stats::live_workers(&mut conn, WORKER_LIVE_MS).await?;
    let active_leases: i64 = queue.iter().map(|k| k.leased).sum();
    Ok(Json(object(
        "system_stats",
        json!({
            "queue": queue,
            "active_leases": active_leases,
            "workers": { "live": workers.len(), "list": workers },
            "queue_backend": "postgres",
            "version": VERSION,
        }),
    )))
}
