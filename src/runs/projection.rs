//! A run's state as its stream's frames carry it (`projection=state`): the run, its last
//! steps and artifacts and its pending approvals, so a live view needs no refetch; and its
//! heartbeat (`heartbeat_s`), how an active run is doing.

use chrono::Utc;
use keel_api_types::{HeartbeatStep, RUN_STATE_ITEMS, RunHeartbeat, RunRecord, RunState};
use sqlx::PgConnection;

use crate::approvals::{ApprovalFilter, OLDEST_FIRST};
use crate::db::Result;
use crate::domain::Scope;

/// The state of `run` (as just read) from the committed rows of its steps, artifacts and
/// approvals.
pub async fn state(conn: &mut PgConnection, scope: &Scope, run: RunRecord) -> Result<RunState> {
    let steps = super::steps::latest(conn, scope, &run.id, RUN_STATE_ITEMS).await?;
    let artifacts = crate::artifacts::latest_of_run(conn, scope, &run.id, RUN_STATE_ITEMS).await?;
    let pending = ApprovalFilter {
        run_id: Some(&run.id),
        status: Some("pending"),
        ..ApprovalFilter::default()
    };
    let pending_approvals =
        crate::approvals::list(conn, scope, pending, OLDEST_FIRST, RUN_STATE_ITEMS).await?;
    Ok(RunState {
        run,
        steps,
        artifacts,
        pending_approvals,
    })
}

/// How `run` (as just read) is doing: its latest step, calls and cost against its task's
/// budget, and how long its attempt has run.
pub async fn heartbeat(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &RunRecord,
) -> Result<RunHeartbeat> {
    let latest = super::steps::latest(conn, scope, &run.id, 1).await?;
    let task = crate::tasks::get(conn, scope, &run.task_id).await?;
    let now = Utc::now();
    let step = latest.into_iter().next().map(|step| HeartbeatStep {
        tool: super::steps::tool_of(&step).map(str::to_string),
        index: step.index,
        name: step.name,
        status: step.status,
    });
    Ok(RunHeartbeat {
        run_id: run.id.clone(),
        status: run.status(),
        attempt: run.attempt,
        elapsed_ms: run
            .started_at
            .map(|started| (now - started).num_milliseconds()),
        step,
        model_calls: run.model_call_count,
        cost_micros_usd: run.total_cost_micros_usd,
        budget_micros_usd: Some(task.budget_micros_usd).filter(|b| *b > 0),
        at: now,
    })
}
