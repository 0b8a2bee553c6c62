//! Usage over real HTTP: a `keel api` in remote mode, two orgs with runs created through the
//! API and model calls written to the `model_calls` ledger with SQL. The summary's sums
//! equal the per-call rows, its scopes group them, the events list pages through them newest
//! first with its filters, bad input answers 400, and neither org sees the other's usage.

use crate::support::agent_rows;
use crate::support::two_orgs;

use std::collections::BTreeSet;

use crate::support::Client;
use agent_rows::{Call, assistant, model_call};
use keel_client::{Grouping, UsageEvent, UsageGroup, UsageSummary, UsageTotals};
use reqwest::StatusCode;
use two_orgs::{Stack, stack, workspace_of};

fn call<'a>(provider: &'a str, model: &'a str, tokens: i64, cost: Option<i64>) -> Call<'a> {
    Call {
        provider,
        model,
        prompt_tokens: tokens,
        completion_tokens: tokens / 4,
        cached_tokens: tokens / 10,
        cost_micros_usd: cost,
    }
}

/// Starts a shell task through the API and records `calls` as its run's model calls.
async fn run_with_calls(stack: &Stack, client: &Client, calls: &[Call<'_>]) -> (String, String) {
    let (task_id, run_id) = client.run_shell("true").await;
    for (n, call) in calls.iter().enumerate() {
        let index = n as i32 + 1;
        model_call(&stack.pool, &run_id, index, *call, assistant("ok")).await;
    }
    (task_id, run_id)
}

/// The totals of the ledger rows matching `filter` (SQL over `model_calls`), as the API
/// renders them.
async fn ledger_totals(pool: &sqlx::PgPool, filter: &str, value: &str) -> UsageTotals {
    let sql = format!(
        "SELECT json_build_object(
             'calls', count(*),
             'prompt_tokens', COALESCE(sum(prompt_tokens), 0),
             'completion_tokens', COALESCE(sum(completion_tokens), 0),
             'cached_tokens', COALESCE(sum(cached_tokens), 0),
             'cost_micros_usd', COALESCE(sum(cost_micros_usd), 0),
             'calls_without_price', count(*) FILTER (WHERE cost_micros_usd IS NULL))
         FROM model_calls WHERE {filter} = $1"
    );
    let totals: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(value)
        .fetch_one(pool)
        .await
        .unwrap();
    serde_json::from_value(totals).unwrap()
}

/// The summary in `scope` (the server's default when None), within `window` (`since`,
/// `until`).
async fn summary(
    client: &Client,
    scope: Option<Grouping>,
    window: &[(&'static str, &str)],
) -> UsageSummary {
    let mut call = client.api.usage_summary(scope);
    for &(name, value) in window {
        call = call.query(name, Some(value));
    }
    let (status, summary) = call.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{summary:?}");
    assert_eq!(summary.object, "usage_summary");
    summary.data
}

/// Whether two summaries are the same, field by field as the API renders them.
fn same(a: &UsageSummary, b: &UsageSummary) -> bool {
    serde_json::to_value(a).unwrap() == serde_json::to_value(b).unwrap()
}

/// Every usage event the filters list, page by page (`limit` each), checking the order.
async fn all_events(
    client: &Client,
    filters: &[(&'static str, &str)],
    limit: usize,
) -> Vec<UsageEvent> {
    let mut events: Vec<UsageEvent> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut call = client.api.usage_events().query("limit", Some(limit));
        for &(name, value) in filters {
            call = call.query(name, Some(value));
        }
        let page = call.query("cursor", cursor.take()).send_with_status().await;
        let (status, page) = page.unwrap();
        assert_eq!(status, StatusCode::OK, "{page:?}");
        assert!(page.data.len() <= limit);
        events.extend(page.data);
        match page.next_cursor {
            Some(next) => {
                assert!(page.has_more);
                cursor = Some(next);
            }
            None => break,
        }
    }
    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
    let mut newest_first = ids.clone();
    newest_first.sort_unstable_by(|x, y| y.cmp(x));
    newest_first.dedup();
    assert_eq!(ids, newest_first, "newest first, each once");
    events
}

fn ids(events: &[UsageEvent]) -> BTreeSet<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

/// The sums of listed events, in the summary's shape.
fn sums(events: &[UsageEvent]) -> UsageTotals {
    let sum = |field: fn(&UsageEvent) -> i64| -> i64 { events.iter().map(field).sum() };
    UsageTotals {
        calls: events.len() as i64,
        prompt_tokens: sum(|e| e.prompt_tokens),
        completion_tokens: sum(|e| e.completion_tokens),
        cached_tokens: sum(|e| e.cached_tokens),
        cost_micros_usd: sum(|e| e.cost_micros_usd.unwrap_or(0)),
        calls_without_price: events
            .iter()
            .filter(|e| e.cost_micros_usd.is_none())
            .count() as i64,
    }
}

#[tokio::test]
async fn usage_sums_scopes_pages_and_stays_in_its_workspace() {
    let stack = stack().await;
    let (a_task, a_run) = run_with_calls(
        &stack,
        &stack.a,
        &[
            call("openai", "gpt-4o-mini", 1000, Some(150)),
            call("openai", "gpt-4o-mini", 2000, Some(300)),
            call("anthropic", "claude-x", 500, None),
        ],
    )
    .await;
    let (_, a_run2) = run_with_calls(
        &stack,
        &stack.a,
        &[
            call("openai", "gpt-4o", 4000, Some(2_000)),
            call("anthropic", "claude-x", 800, None),
        ],
    )
    .await;
    let (b_task, b_run) = run_with_calls(
        &stack,
        &stack.b,
        &[call("openai", "gpt-4o", 99_000, Some(77_777))],
    )
    .await;
    let a_ws = workspace_of(&stack.pool, &a_run).await;
    let b_ws = workspace_of(&stack.pool, &b_run).await;
    assert_ne!(a_ws, b_ws);

    // Global (the default): the workspace's ledger, summed; equal to its listed rows.
    let a_global = summary(&stack.a, None, &[]).await;
    assert_eq!(a_global.scope, Grouping::Global);
    assert!(a_global.rows.is_empty());
    assert_eq!(
        a_global.totals,
        ledger_totals(&stack.pool, "workspace_id", &a_ws).await
    );
    assert_eq!(a_global.totals.calls, 5);
    assert_eq!(a_global.totals.calls_without_price, 2);
    assert_eq!(a_global.totals.cost_micros_usd, 2_450);
    let a_events = all_events(&stack.a, &[], 2).await;
    assert_eq!(a_events.len(), 5);
    assert_eq!(sums(&a_events), a_global.totals);
    let global = summary(&stack.a, Some(Grouping::Global), &[]).await;
    assert!(same(&global, &a_global), "{global:?} vs {a_global:?}");

    // One row per provider, each the ledger's sum for it; the rows add up to the totals.
    let by_provider = summary(&stack.a, Some(Grouping::Provider), &[]).await;
    assert_eq!(by_provider.totals, a_global.totals);
    let rows = &by_provider.rows;
    let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["anthropic", "openai"]);
    for row in rows {
        let provider = row.key.as_str();
        let listed = all_events(&stack.a, &[("provider", provider)], 50).await;
        let expected = UsageGroup {
            key: provider.to_string(),
            totals: sums(&listed),
        };
        assert_eq!(row, &expected);
    }
    let anthropic = &rows[0].totals;
    assert_eq!(anthropic.calls, 2);
    assert_eq!(anthropic.calls_without_price, 2);
    assert_eq!(anthropic.cost_micros_usd, 0);

    // The workspace scope has the caller's workspace alone.
    let by_workspace = summary(&stack.a, Some(Grouping::Workspace), &[]).await;
    let rows = &by_workspace.rows;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].key, a_ws);
    assert_eq!(rows[0].totals.calls, 5);

    // The other org sees its own call alone, in every scope and list.
    let b_global = summary(&stack.b, Some(Grouping::Global), &[]).await;
    assert_eq!(
        b_global.totals,
        ledger_totals(&stack.pool, "workspace_id", &b_ws).await
    );
    assert_eq!(b_global.totals.calls, 1);
    let b_rows = summary(&stack.b, Some(Grouping::Workspace), &[]).await.rows;
    assert_eq!(b_rows.len(), 1);
    assert_eq!(b_rows[0].key, b_ws);
    let b_events = all_events(&stack.b, &[], 50).await;
    assert_eq!(b_events.len(), 1);
    assert!(ids(&b_events).is_disjoint(&ids(&a_events)));
    for filter in [
        ("run_id", a_run.as_str()),
        ("task_id", a_task.as_str()),
        ("provider", "anthropic"),
    ] {
        let listed = all_events(&stack.b, &[filter], 50).await;
        assert!(listed.is_empty(), "{filter:?}");
    }
    assert!(
        all_events(&stack.a, &[("task_id", &b_task)], 50)
            .await
            .is_empty()
    );

    // Filters: each run's calls, one model's, one task's, with their fields.
    let run2 = all_events(&stack.a, &[("run_id", &a_run2)], 50).await;
    assert_eq!(run2.len(), 2);
    let newest = &run2[0];
    assert_eq!(newest.index, 2);
    assert_eq!(newest.run_id, a_run2);
    assert_eq!(newest.provider, "anthropic");
    assert_eq!(newest.model, "claude-x");
    assert_eq!(newest.prompt_tokens, 800);
    assert_eq!(newest.completion_tokens, 200);
    assert_eq!(newest.cached_tokens, 80);
    assert!(newest.cost_micros_usd.is_none());
    assert_eq!(newest.duration_ms, 12);
    // `created_at` was read as a timestamp with the record, or the list would not decode.
    let one_model = all_events(
        &stack.a,
        &[("model", "gpt-4o-mini"), ("provider", "openai")],
        50,
    )
    .await;
    assert_eq!(one_model.len(), 2);
    let one_task = all_events(&stack.a, &[("task_id", &a_task)], 1).await;
    assert_eq!(one_task.len(), 3);
    assert!(one_task.iter().all(|e| e.task_id == a_task));

    // Windows: everything is before a future `since`, and after a past one.
    let future = summary(&stack.a, None, &[("since", "2099-01-01T00:00:00Z")]).await;
    assert_eq!(future.totals.calls, 0);
    assert_eq!(future.since, Some("2099-01-01T00:00:00Z".parse().unwrap()));
    let past = summary(
        &stack.a,
        Some(Grouping::Provider),
        &[
            ("since", "2000-01-01T00:00:00Z"),
            ("until", "2099-01-01T00:00:00+02:00"),
        ],
    )
    .await;
    assert_eq!(past.totals, a_global.totals);
    assert!(
        all_events(&stack.a, &[("until", "2000-01-01T00:00:00Z")], 50)
            .await
            .is_empty()
    );
    // A reversed window is empty, not an error.
    let reversed = summary(
        &stack.a,
        None,
        &[
            ("since", "2099-01-02T00:00:00Z"),
            ("until", "2099-01-01T00:00:00Z"),
        ],
    )
    .await;
    assert_eq!(reversed.totals.calls, 0);
}

#[tokio::test]
async fn bad_usage_queries_answer_400() {
    let stack = stack().await;
    for path in [
        "/v1/usage/summary?scope=everything",
        "/v1/usage/summary?since=yesterday",
        "/v1/usage/summary?bogus=1",
        "/v1/usage/events?cursor=not-a-cursor",
        "/v1/usage/events?cursor=mc_zz",
        "/v1/usage/events?until=soon",
        "/v1/usage/events?limit=0",
        "/v1/usage/events?limit=201",
    ] {
        let (status, body) = stack.a.get(path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request", "{path}");
        assert!(body["error"]["message"].is_string(), "{path}");
    }
}
