//! Task schedules and their occurrence history.

use std::collections::BTreeSet;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use chrono::{DateTime, SecondsFormat, Utc};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{ApiJson, ApiQuery};
use crate::api::{
    ApiError, AppState, ListEnvelope, ObjectEnvelope, PageQuery, list, object, page_limit,
};
use crate::domain::Caller;
use crate::schedules;
use crate::schedules::{NewSchedule, ScheduleDraft};
use crate::schedules::{OccurrenceRecord, ScheduleFilter, ScheduleRecord};

const DEFAULT_SCHEDULE_PAGE: i64 = 100;
const MAX_SCHEDULE_PAGE: i64 = 200;
/// Most distinct `task_id` values one list request may filter on.
const MAX_TASK_IDS: usize = 200;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_schedules))
        .routes(routes!(get_schedule, put_schedule, delete_schedule))
        .routes(routes!(list_occurrences))
}

/// The list's query, parsed by hand: `task_id` may repeat, which the derived query
/// extractor cannot express.
#[derive(Debug, Default)]
struct ScheduleListQuery {
    filter: ScheduleFilter,
    limit: i64,
    cursor: Option<String>,
}

fn parse_list_query(raw: Option<&str>) -> Result<ScheduleListQuery, ApiError> {
    let mut task_ids = BTreeSet::new();
    let mut query = ScheduleListQuery {
        limit: DEFAULT_SCHEDULE_PAGE,
        ..ScheduleListQuery::default()
    };
    for (key, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            // Blank ids are ignored and repeats collapse: the filter is a set.
            "task_id" if value.trim().is_empty() => {}
            "task_id" => {
                task_ids.insert(value.into_owned());
            }
            "enabled" => {
                query.filter.enabled = Some(match value.as_ref() {
                    "true" => true,
                    "false" => false,
                    other => {
                        return Err(ApiError::invalid(format!(
                            "enabled must be true or false, not '{other}'"
                        )));
                    }
                });
            }
            "limit" => query.limit = parse_limit(&value)?,
            "cursor" => query.cursor = Some(value.into_owned()),
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter '{other}' (expected task_id, enabled, limit or cursor)"
                )));
            }
        }
    }
    if task_ids.len() > MAX_TASK_IDS {
        return Err(ApiError::invalid(format!(
            "at most {MAX_TASK_IDS} distinct task_id values, not {}",
            task_ids.len()
        )));
    }
    query.filter.task_ids = task_ids.into_iter().collect();
    Ok(query)
}

fn parse_limit(value: &str) -> Result<i64, ApiError> {
    match value.parse::<i64>() {
        Ok(n @ 1..=MAX_SCHEDULE_PAGE) => Ok(n),
        _ => Err(ApiError::invalid(format!(
            "limit must be between 1 and {MAX_SCHEDULE_PAGE}, not '{value}'"
        ))),
    }
}

/// Lists schedules across tasks.
#[utoipa::path(get, path = "/task-schedules", tag = "schedules",
    params(
        ("task_id" = Option<Vec<String>>, Query, description = "Repeatable; at most 200 distinct ids"),
        ("enabled" = Option<bool>, Query),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 200, description = "Page size (default 100)"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page")),
    responses((status = 200, description = "A page of schedules", body = ListEnvelope<ScheduleRecord>)))]
async fn list_schedules(
    State(state): State<AppState>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> Result<Json<ListEnvelope<ScheduleRecord>>, ApiError> {
    let query = parse_list_query(raw.as_deref())?;
    let mut conn = state.pool.acquire().await?;
    let rows = schedules::list(
        &mut conn,
        &caller.scope,
        &query.filter,
        query.cursor.as_deref(),
        query.limit + 1,
    )
    .await?;
    Ok(Json(list(rows, query.limit, |s| s.id.clone())))
}

/// Reads a task's schedule.
#[utoipa::path(get, path = "/tasks/{task_id}/schedule", tag = "schedules", params(("task_id" = String, Path)),
    responses((status = 200, description = "The schedule", body = ObjectEnvelope<ScheduleRecord>)))]
async fn get_schedule(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
) -> Result<Json<ObjectEnvelope<ScheduleRecord>>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let schedule = schedules::get(&mut conn, &caller.scope, &task_id).await?;
    Ok(Json(object("task_schedule", schedule)))
}

/// Creates or replaces the schedule; 409 when the client's `revision` is stale.
#[utoipa::path(put, path = "/tasks/{task_id}/schedule", tag = "schedules", params(("task_id" = String, Path)),
    request_body = ScheduleDraft,
    responses((status = 200, description = "The schedule", body = ObjectEnvelope<ScheduleRecord>)))]
async fn put_schedule(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
    ApiJson(draft): ApiJson<ScheduleDraft>,
) -> Result<Json<ObjectEnvelope<ScheduleRecord>>, ApiError> {
    let now = Utc::now();
    let new = NewSchedule::parse(draft, now)?;
    let mut tx = state.pool.begin().await?;
    let (scope, actor) = (&caller.scope, &caller.actor());
    let schedule = schedules::put(&mut tx, scope, &task_id, &new, now, actor).await?;
    tx.commit().await?;
    Ok(Json(object("task_schedule", schedule)))
}

/// Deletes the schedule and its occurrence history.
#[utoipa::path(delete, path = "/tasks/{task_id}/schedule", tag = "schedules", params(("task_id" = String, Path)),
    responses((status = 204, description = "Deleted")))]
async fn delete_schedule(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let mut tx = state.pool.begin().await?;
    schedules::delete(&mut tx, &caller.scope, &task_id, &caller.actor()).await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The schedule's occurrences, newest first; the cursor is the `scheduled_for` of the
/// last occurrence of a page.
#[utoipa::path(get, path = "/tasks/{task_id}/schedule/occurrences", tag = "schedules",
    params(("task_id" = String, Path), ("limit" = Option<i64>, Query, minimum = 1, maximum = 200, description = "Page size, 1 to 200 (default 50)"),
           ("cursor" = Option<String>, Query, format = DateTime, description = "`next_cursor` of the previous page: an occurrence's `scheduled_for`")),
    responses((status = 200, description = "A page of occurrences", body = ListEnvelope<OccurrenceRecord>)))]
async fn list_occurrences(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<ListEnvelope<OccurrenceRecord>>, ApiError> {
    let limit = page_limit(page.limit)?;
    let before = match page.cursor.as_deref() {
        None => None,
        Some(cursor) => Some(
            DateTime::parse_from_rfc3339(cursor)
                .map_err(|_| ApiError::invalid("cursor must be a next_cursor from this list"))?
                .with_timezone(&Utc),
        ),
    };
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    let rows = schedules::occurrences(&mut conn, scope, &task_id, before, limit + 1).await?;
    Ok(Json(list(rows, limit, |o| {
        o.scheduled_for.to_rfc3339_opts(SecondsFormat::AutoSi, true)
    })))
}
