//! Health, readiness, system stats and throughput, the audit trail and queue leases.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use keel_api_types::{EntityType, Health, ListOrder, Readiness, SystemStats, Throughput, Workers};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::ApiQuery;
use crate::api::{
    ApiError, AppState, ListEnvelope, ObjectEnvelope, list, list_order, object, page_limit,
};
use crate::domain::Caller;
use crate::events::transitions;
use crate::events::transitions::TransitionRecord;
use crate::system::leases;
use crate::system::leases::{LeaseRecord, LeaseStatus};
use crate::system::stats;

pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

pub(crate) fn v1_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(system_stats))
        .routes(routes!(system_throughput))
        .routes(routes!(state_transitions))
        .routes(routes!(runtime_leases))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct TransitionQuery {
    #[param(value_type = Option<EntityType>, inline)]
    entity_type: Option<String>,
    entity_id: Option<String>,
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^[0-9]{1,18}$")]
    cursor: Option<String>,
    /// `asc`, oldest first (the default), or `desc`, newest first; the cursor pages on in
    /// the same order.
    #[param(value_type = Option<ListOrder>, inline)]
    order: Option<String>,
}

/// A page's position, when one is given: ASCII digits, at most 18 (so it fits an i64), as
/// the document's pattern says.
fn numeric_cursor(cursor: Option<&str>) -> Result<Option<i64>, ApiError> {
    let Some(c) = cursor else { return Ok(None) };
    Some(c)
        .filter(|c| (1..=18).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|c| c.parse().ok())
        .map(Some)
        .ok_or_else(|| ApiError::invalid("cursor must be a number from a previous page"))
}

/// The workspace's audit trail: every state change of its tasks, runs, approvals, media
/// jobs and schedules, oldest first (newest first with `order=desc`).
#[utoipa::path(get, path = "/state-transitions", tag = "system", params(TransitionQuery),
    responses((status = 200, description = "A page of transitions", body = ListEnvelope<TransitionRecord>)))]
async fn state_transitions(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<TransitionQuery>,
) -> Result<Json<ListEnvelope<TransitionRecord>>, ApiError> {
    let limit = page_limit(query.limit)?;
    if let Some(kind) = query
        .entity_type
        .as_deref()
        .filter(|k| EntityType::parse(k).is_none())
    {
        return Err(ApiError::invalid(format!(
            "unknown entity_type '{kind}' (expected {})",
            EntityType::names()
        )));
    }
    let after = numeric_cursor(query.cursor.as_deref())?;
    let page = (list_order(query.order.as_deref())?, after);
    let mut conn = state.pool.acquire().await?;
    let rows = transitions::list(
        &mut conn,
        &caller.scope,
        query.entity_type.as_deref(),
        query.entity_id.as_deref(),
        page,
        limit + 1,
    )
    .await?;
    Ok(Json(list(rows, limit, |t| t.id.to_string())))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct LeaseQuery {
    /// Default `active`.
    #[param(value_type = Option<LeaseStatus>, inline)]
    status: Option<String>,
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^[0-9]{1,18}$")]
    cursor: Option<String>,
}

/// The workspace's queue leases: `active`, `expired` (not yet taken over) or `released`
/// (kept 7 days).
#[utoipa::path(get, path = "/runtime/leases", tag = "system", params(LeaseQuery),
    responses((status = 200, description = "A page of leases", body = ListEnvelope<LeaseRecord>)))]
async fn runtime_leases(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<LeaseQuery>,
) -> Result<Json<ListEnvelope<LeaseRecord>>, ApiError> {
    let limit = page_limit(query.limit)?;
    let status = query.status.as_deref().unwrap_or("active");
    let status = LeaseStatus::parse(status).ok_or_else(|| {
        ApiError::invalid(format!(
            "unknown lease status '{status}' (expected active, released or expired)"
        ))
    })?;
    let after = numeric_cursor(query.cursor.as_deref())?.unwrap_or_default();
    let mut conn = state.pool.acquire().await?;
    let rows = leases::list(&mut conn, &caller.scope, status, after, limit + 1).await?;
    Ok(Json(
        list(rows, limit, |(cursor, _)| cursor.to_string()).map(|(_, lease)| lease),
    ))
}

/// Liveness: the process serves HTTP. Touches nothing else.
#[utoipa::path(get, path = "/healthz", tag = "system",
    responses((status = 200, description = "Alive", body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".to_string(),
        time: Utc::now(),
        version: VERSION.to_string(),
    })
}

/// Readiness: the database answers and has every migration this binary needs.
#[utoipa::path(get, path = "/readyz", tag = "system",
    responses((status = 200, description = "Ready", body = Readiness),
              (status = 503, description = "Not ready", body = Readiness)))]
async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let (status, database, migrations) = match crate::db::migrations_current(&state.pool).await {
        Ok(true) => (StatusCode::OK, "ok", "current"),
        Ok(false) => (StatusCode::SERVICE_UNAVAILABLE, "ok", "pending"),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "unreachable", "unknown"),
    };
    let ready = if status == StatusCode::OK {
        "ready"
    } else {
        "not_ready"
    };
    (
        status,
        Json(Readiness {
            status: ready.to_string(),
            database: database.to_string(),
            migrations: migrations.to_string(),
        }),
    )
}

/// The workspace's queue depth and age per kind and its leases, and live workers across
/// all replicas (with the leases each holds of the workspace; their hosts and pids for
/// the local caller only).
#[utoipa::path(get, path = "/system/stats", tag = "system",
    responses((status = 200, description = "The figures", body = ObjectEnvelope<SystemStats>)))]
async fn system_stats(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<ObjectEnvelope<SystemStats>>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let queue = stats::queue(&mut conn, &caller.scope).await?;
    let mut workers = stats::live_workers(&mut conn, &caller.scope, stats::WORKER_LIVE_MS).await?;
    // A tenant (its operators too) sees that workers are live and what they hold of its
    // workspace, not where the deployment runs them.
    if !caller.is_local() {
        for worker in &mut workers {
            worker.hostname = None;
            worker.pid = None;
        }
    }
    let active_leases: i64 = queue.iter().map(|k| k.leased).sum();
    let workers = Workers {
        live: workers.len(),
        list: workers,
    };
    let stats = SystemStats {
        queue,
        active_leases,
        workers,
        queue_backend: "postgres".to_string(),
        version: VERSION.to_string(),
    };
    Ok(Json(object("system_stats", stats)))
}

/// The longest throughput window, in minutes.
const MAX_THROUGHPUT_MINUTES: i64 = 60;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ThroughputQuery {
    /// The window, 1 to 60 minutes back from now (default 15).
    #[param(minimum = 1, maximum = 60)]
    minutes: Option<i64>,
}

/// The workspace's queue throughput: attempts that ended in the last minutes, completed
/// (acked) and failed (retried or lease expired), per job kind in buckets of 10 s (windows
/// up to 15 minutes) or 60 s.
#[utoipa::path(get, path = "/system/throughput", tag = "system", params(ThroughputQuery),
    responses((status = 200, description = "The buckets", body = ObjectEnvelope<Throughput>)))]
async fn system_throughput(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ThroughputQuery>,
) -> Result<Json<ObjectEnvelope<Throughput>>, ApiError> {
    let minutes = match query.minutes.unwrap_or(15) {
        n @ 1..=MAX_THROUGHPUT_MINUTES => n,
        n => {
            return Err(ApiError::invalid(format!(
                "minutes must be between 1 and {MAX_THROUGHPUT_MINUTES}, not {n}"
            )));
        }
    };
    let mut conn = state.pool.acquire().await?;
    let throughput = stats::throughput(&mut conn, &caller.scope, minutes).await?;
    Ok(Json(object("throughput", throughput)))
}
