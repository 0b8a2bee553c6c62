//! What an attempt of an `agent_loop` run reads from the run's rows to rebuild its loop,
//! and the notification that carries its live text; the ledger's writes are in
//! [`super::model_calls`].

use keel_workers::agent::run_loop::ApprovalDecision;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use crate::db::Result;
use crate::domain::Scope;

/// A completed `model_call` or `tool_call` step, as the conversation is rebuilt from it.
pub(crate) struct Persisted {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) input: Value,
    pub(crate) output: Option<Value>,
}

/// The run's completed model call and tool call steps, in step order.
pub(crate) async fn completed_calls(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
) -> Result<Vec<Persisted>> {
    let rows = sqlx::query_as!(
        Persisted,
        "SELECT id, name, input, output FROM steps
         WHERE workspace_id = $1 AND run_id = $2 AND status = 'completed'
           AND name IN ('model_call', 'tool_call')
         ORDER BY index",
        scope.workspace(),
        run_id,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// The model calls of the runs this one carries on from (its `resumed_from` chain).
pub(crate) async fn prior_model_calls(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
) -> Result<u32> {
    let calls = sqlx::query_scalar!(
        r#"WITH RECURSIVE chain (id, depth) AS (
               SELECT resumed_from_run_id, 1 FROM runs WHERE workspace_id = $1 AND id = $2
               UNION ALL
               SELECT r.resumed_from_run_id, c.depth + 1 FROM runs r JOIN chain c ON r.id = c.id
               WHERE r.workspace_id = $1 AND c.depth < 10000
           )
           SELECT COALESCE(sum(r.model_call_count), 0)::bigint AS "calls!"
           FROM runs r JOIN chain c ON r.id = c.id WHERE r.workspace_id = $1"#,
        scope.workspace(),
        run_id,
    )
    .fetch_one(conn)
    .await?;
    Ok(u32::try_from(calls).unwrap_or(u32::MAX))
}

/// The operator's decision on the tool calls of model call step `step_id`, if one was made.
pub(crate) async fn decision(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    step_id: &str,
) -> Result<Option<ApprovalDecision>> {
    let decided = sqlx::query!(
        "SELECT status, continue_on_reject FROM approvals
         WHERE workspace_id = $1 AND run_id = $2 AND step_id = $3
           AND kind = 'agent_loop_tool_call'
         ORDER BY id DESC LIMIT 1",
        scope.workspace(),
        run_id,
        step_id,
    )
    .fetch_optional(conn)
    .await?
    .map(|row| (row.status, row.continue_on_reject));
    Ok(match decided {
        Some((status, _)) if status == "approved" => Some(ApprovalDecision::Approved),
        Some((status, true)) if status == "rejected" => Some(ApprovalDecision::Refused),
        _ => None,
    })
}

/// Sends `payload` on `channel` with `pg_notify`, outside any transaction.
pub(crate) async fn notify(pool: &PgPool, channel: &str, payload: &str) -> Result<()> {
    sqlx::query!("SELECT pg_notify($1, $2)", channel, payload)
        .execute(pool)
        .await?;
    Ok(())
}
