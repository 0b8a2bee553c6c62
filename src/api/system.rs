//! Health, readiness and system stats.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use super::{ApiError, AppState, object};
use crate::store::{self, stats};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// A worker is live while its registry heartbeat is younger than this.
const WORKER_LIVE_MS: i64 = 30_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

pub fn v1_router() -> Router<AppState> {
    Router::new().route("/system/stats", get(system_stats))
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
