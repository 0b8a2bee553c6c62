//! The usage ledger: one row per completed model call of an agent loop run, written with
//! its `model_call` step, and the run's counters that sum it.

use keel_workers::agent::Usage;
use sqlx::PgConnection;

use crate::db::Result;
use crate::domain::{Scope, new_id};

/// One completed call, as the ledger records it.
pub(crate) struct NewModelCall<'a> {
    pub(crate) task_id: &'a str,
    pub(crate) run_id: &'a str,
    pub(crate) step_id: &'a str,
    /// Run-local and 1-based.
    pub(crate) index: u32,
    pub(crate) provider: &'a str,
    pub(crate) model: &'a str,
    pub(crate) usage: &'a Usage,
    /// None: the price table does not know the model.
    pub(crate) cost_micros_usd: Option<i64>,
    pub(crate) duration_ms: i64,
}

/// Writes the ledger row and bumps the run's `model_call_count`, `model`, `provider` and
/// `total_cost_micros_usd`, clearing its `model_call_in_flight`, in the caller's
/// transaction: one statement.
pub async fn insert(conn: &mut PgConnection, scope: &Scope, call: &NewModelCall<'_>) -> Result<()> {
    let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    sqlx::query!(
        "WITH ledger AS (
             INSERT INTO model_calls (id, workspace_id, task_id, run_id, step_id, index, provider,
                                      model, prompt_tokens, completion_tokens, cached_tokens,
                                      cost_micros_usd, duration_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         )
         UPDATE runs SET model_call_count = model_call_count + 1, model = $8, provider = $7,
                         total_cost_micros_usd = total_cost_micros_usd + COALESCE($12, 0),
                         model_call_in_flight = NULL, updated_at = now()
         WHERE workspace_id = $2 AND id = $4",
        new_id("mc"),
        scope.workspace(),
        call.task_id,
        call.run_id,
        call.step_id,
        call.index as i32,
        call.provider,
        call.model,
        tokens(call.usage.prompt_tokens),
        tokens(call.usage.completion_tokens),
        tokens(call.usage.cached_tokens),
        call.cost_micros_usd,
        call.duration_ms,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks model call `index` of the run in flight, in the caller's (fenced) transaction,
/// before the call starts; [`insert`] clears it.
pub(crate) async fn start(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    index: u32,
) -> Result<()> {
    sqlx::query!(
        "UPDATE runs SET model_call_in_flight = $3 WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        run_id,
        index as i32,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// The model call a previous attempt of the run left in flight (it stopped before recording
/// it), counted into `abandoned_model_calls` and cleared: one statement. None when there was
/// none.
pub(crate) async fn settle_abandoned(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
) -> Result<Option<u32>> {
    let index = sqlx::query_scalar!(
        r#"UPDATE runs r SET abandoned_model_calls = r.abandoned_model_calls + 1,
                             model_call_in_flight = NULL, updated_at = now()
           FROM (SELECT id, model_call_in_flight FROM runs
                 WHERE workspace_id = $1 AND id = $2 FOR UPDATE) AS before
           WHERE r.id = before.id AND before.model_call_in_flight IS NOT NULL
           RETURNING before.model_call_in_flight AS "model_call_in_flight!""#,
        scope.workspace(),
        run_id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(index.map(|index| index as u32))
}
