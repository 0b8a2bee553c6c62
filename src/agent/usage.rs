//! Usage: sums and rows of the `model_calls` ledger (one row per completed model call),
//! always within the caller's workspace.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::db::Result;
use crate::domain::Scope;

pub(crate) use keel_api_types::{Grouping, UsageEvent, UsageGroup, UsageTotals};

/// A time window over `created_at`: `since` inclusive, `until` exclusive; either open.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Window {
    pub(crate) since: Option<DateTime<Utc>>,
    pub(crate) until: Option<DateTime<Utc>>,
}

/// The workspace's totals in the window.
pub(crate) async fn totals(
    conn: &mut PgConnection,
    scope: &Scope,
    window: Window,
) -> Result<UsageTotals> {
    let totals = sqlx::query_as!(
        UsageTotals,
        r#"SELECT count(*) AS "calls!",
                  COALESCE(sum(prompt_tokens), 0)::bigint AS "prompt_tokens!",
                  COALESCE(sum(completion_tokens), 0)::bigint AS "completion_tokens!",
                  COALESCE(sum(cached_tokens), 0)::bigint AS "cached_tokens!",
                  COALESCE(sum(cost_micros_usd), 0)::bigint AS "cost_micros_usd!",
                  count(*) FILTER (WHERE cost_micros_usd IS NULL) AS "calls_without_price!"
           FROM model_calls
           WHERE workspace_id = $1
             AND ($2::timestamptz IS NULL OR created_at >= $2)
             AND ($3::timestamptz IS NULL OR created_at < $3)"#,
        scope.workspace(),
        window.since,
        window.until,
    )
    .fetch_one(conn)
    .await?;
    Ok(totals)
}

/// The workspace's totals in the window, one row per provider or workspace (by key); none
/// for [`Grouping::Global`].
pub(crate) async fn groups(
    conn: &mut PgConnection,
    scope: &Scope,
    grouping: Grouping,
    window: Window,
) -> Result<Vec<UsageGroup>> {
    if grouping == Grouping::Global {
        return Ok(Vec::new());
    }
    let rows = sqlx::query!(
        r#"SELECT CASE WHEN $4 = 'provider' THEN provider ELSE workspace_id END AS "key!",
                  count(*) AS "calls!",
                  COALESCE(sum(prompt_tokens), 0)::bigint AS "prompt_tokens!",
                  COALESCE(sum(completion_tokens), 0)::bigint AS "completion_tokens!",
                  COALESCE(sum(cached_tokens), 0)::bigint AS "cached_tokens!",
                  COALESCE(sum(cost_micros_usd), 0)::bigint AS "cost_micros_usd!",
                  count(*) FILTER (WHERE cost_micros_usd IS NULL) AS "calls_without_price!"
           FROM model_calls
           WHERE workspace_id = $1
             AND ($2::timestamptz IS NULL OR created_at >= $2)
             AND ($3::timestamptz IS NULL OR created_at < $3)
           GROUP BY 1 ORDER BY 1"#,
        scope.workspace(),
        window.since,
        window.until,
        grouping.as_str(),
    )
    .fetch_all(conn)
    .await?;
    let groups = rows
        .into_iter()
        .map(|row| UsageGroup {
            key: row.key,
            totals: UsageTotals {
                calls: row.calls,
                prompt_tokens: row.prompt_tokens,
                completion_tokens: row.completion_tokens,
                cached_tokens: row.cached_tokens,
                cost_micros_usd: row.cost_micros_usd,
                calls_without_price: row.calls_without_price,
            },
        })
        .collect();
    Ok(groups)
}

/// Which model calls a list holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct EventFilter {
    pub(crate) task_id: Option<String>,
    pub(crate) run_id: Option<String>,
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) window: Window,
}

/// Newest first; `before` is the id of the last call of the previous page (ids are
/// time-ordered UUIDv7s).
pub(crate) async fn events(
    conn: &mut PgConnection,
    scope: &Scope,
    filter: &EventFilter,
    before: Option<&str>,
    limit: i64,
) -> Result<Vec<UsageEvent>> {
    let rows = sqlx::query_as!(
        UsageEvent,
        "SELECT id, task_id, run_id, index, provider, model, prompt_tokens, completion_tokens,
                cached_tokens, cost_micros_usd, duration_ms, created_at
         FROM model_calls
         WHERE workspace_id = $1
           AND ($2::timestamptz IS NULL OR created_at >= $2)
           AND ($3::timestamptz IS NULL OR created_at < $3)
           AND ($4::text IS NULL OR id < $4)
           AND ($5::text IS NULL OR task_id = $5)
           AND ($6::text IS NULL OR run_id = $6)
           AND ($7::text IS NULL OR provider = $7)
           AND ($8::text IS NULL OR model = $8)
         ORDER BY id DESC LIMIT $9",
        scope.workspace(),
        filter.window.since,
        filter.window.until,
        before,
        filter.task_id.as_deref(),
        filter.run_id.as_deref(),
        filter.provider.as_deref(),
        filter.model.as_deref(),
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}
