//! Usage of model calls: totals and the per-call ledger, within the caller's workspace.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use keel_api_types::UsageSummary;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::agent::usage;
use crate::agent::usage::{EventFilter, Grouping, UsageEvent, Window};
use crate::api::extract::ApiQuery;
use crate::api::{ApiError, AppState, ListEnvelope, ObjectEnvelope, list, object, page_limit};
use crate::domain::Caller;

type Result<T> = std::result::Result<T, ApiError>;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(usage_summary))
        .routes(routes!(usage_events))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct SummaryQuery {
    /// `global` (default): the totals only; `provider` or `workspace`: also one row per
    /// provider preset or per workspace. Always within the caller's workspace.
    #[param(value_type = Option<Grouping>, inline)]
    scope: Option<String>,
    /// Only calls at or after this time (RFC 3339).
    #[param(format = DateTime)]
    since: Option<String>,
    /// Only calls before this time (RFC 3339); before `since`, nothing matches.
    #[param(format = DateTime)]
    until: Option<String>,
}

/// Sums of the model calls of the caller's workspace (a remote caller sees only its own
/// workspace, whatever the scope).
#[utoipa::path(get, path = "/usage/summary", tag = "usage", params(SummaryQuery),
    responses((status = 200, description = "The usage summary", body = ObjectEnvelope<UsageSummary>),
              (status = 400, description = "An unknown scope or a bad date")))]
async fn usage_summary(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<SummaryQuery>,
) -> Result<Json<ObjectEnvelope<UsageSummary>>> {
    let grouping = match query.scope.as_deref() {
        None => Grouping::Global,
        Some(value) => Grouping::parse(value).ok_or_else(|| {
            ApiError::invalid(format!(
                "unknown scope '{value}' (expected {})",
                Grouping::names()
            ))
        })?,
    };
    let window = window(query.since.as_deref(), query.until.as_deref())?;
    let mut conn = state.pool.acquire().await?;
    let totals = usage::totals(&mut conn, &caller.scope, window).await?;
    let rows = usage::groups(&mut conn, &caller.scope, grouping, window).await?;
    let summary = UsageSummary {
        scope: grouping,
        since: window.since,
        until: window.until,
        totals,
        rows,
    };
    Ok(Json(object("usage_summary", summary)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page: a model call's id.
    #[param(pattern = "^[a-z]+_[0-9A-Fa-f]{32}$")]
    cursor: Option<String>,
    task_id: Option<String>,
    run_id: Option<String>,
    /// A provider preset id.
    provider: Option<String>,
    model: Option<String>,
    /// Only calls at or after this time (RFC 3339).
    #[param(format = DateTime)]
    since: Option<String>,
    /// Only calls before this time (RFC 3339); before `since`, nothing matches.
    #[param(format = DateTime)]
    until: Option<String>,
}

/// The workspace's model calls, one row each, newest first (as tasks are listed).
#[utoipa::path(get, path = "/usage/events", tag = "usage", params(EventsQuery),
    responses((status = 200, description = "A page of model calls", body = ListEnvelope<UsageEvent>),
              (status = 400, description = "A bad cursor, limit or date")))]
async fn usage_events(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Json<ListEnvelope<UsageEvent>>> {
    let limit = page_limit(query.limit)?;
    let cursor = query.cursor.as_deref().map(checked_cursor).transpose()?;
    let filter = EventFilter {
        window: window(query.since.as_deref(), query.until.as_deref())?,
        task_id: query.task_id,
        run_id: query.run_id,
        provider: query.provider,
        model: query.model,
    };
    let mut conn = state.pool.acquire().await?;
    let rows = usage::events(&mut conn, &caller.scope, &filter, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |e| e.id.clone())))
}

/// A cursor is the id of a model call: `<prefix>_<32 hex digits>`.
fn checked_cursor(cursor: &str) -> Result<&str> {
    let well_formed = cursor.split_once('_').is_some_and(|(prefix, hex)| {
        !prefix.is_empty()
            && prefix.bytes().all(|b| b.is_ascii_lowercase())
            && hex.len() == 32
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
    });
    if well_formed {
        Ok(cursor)
    } else {
        Err(ApiError::invalid(
            "cursor must be the next_cursor of a previous page (a model call id)",
        ))
    }
}

fn window(since: Option<&str>, until: Option<&str>) -> Result<Window> {
    Ok(Window {
        since: since.map(|s| timestamp("since", s)).transpose()?,
        until: until.map(|s| timestamp("until", s)).transpose()?,
    })
}

fn timestamp(name: &str, value: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| {
            ApiError::invalid(format!(
                "{name} must be an RFC 3339 time such as 2026-12-01T00:00:00Z, not '{value}'"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_are_model_call_ids() {
        let id = crate::domain::new_id("mc");
        assert!(checked_cursor(&id).is_ok());
        for bad in [
            "",
            "x",
            "mc_",
            "mc_xyz",
            "_0123456789abcdef0123456789abcdef",
            "MC_1",
        ] {
            assert!(checked_cursor(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn windows_are_rfc3339() {
        assert!(
            window(
                Some("2026-12-01T00:00:00Z"),
                Some("2026-12-02T00:00:00+01:00")
            )
            .is_ok()
        );
        assert!(window(Some("yesterday"), None).is_err());
        // Reversed, the window is empty: nothing matches, which is no error.
        assert!(window(Some("2026-12-02T00:00:00Z"), Some("2026-12-01T00:00:00Z")).is_ok());
    }
}
