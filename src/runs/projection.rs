//! A run's state as its stream's frames carry it (`projection=state`): the run, its last
//! steps and artifacts and its pending approvals, so a live view needs no refetch.

use keel_api_types::{RUN_STATE_ITEMS, RunRecord, RunState};
use sqlx::PgConnection;

use crate::approvals::ApprovalFilter;
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
        crate::approvals::list(conn, scope, pending, None, RUN_STATE_ITEMS).await?;
    Ok(RunState {
        run,
        steps,
        artifacts,
        pending_approvals,
    })
}
