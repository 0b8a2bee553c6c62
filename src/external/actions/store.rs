//! External action rows: what will be sent to a tracker, the target as it stood at the
//! proposal, and where the action stands. The `external_action` queue job (ref_id: the
//! action id) sends it; its approval lives in `approvals` and points here.

use std::collections::BTreeMap;

use sqlx::PgConnection;

use crate::approvals::{self, ApprovalRecord, Decision};
use crate::attempt::JobKind;
use crate::db::{Result, StoreError};
use crate::domain::{Actor, Scope};
use crate::events;
use crate::queue;
use crate::runs::{self, RunRecord};
use keel_api_types::ActionStatus;

pub(crate) use keel_api_types::ActionRecord;

/// `query_as!` of [`ActionRecord`]s: `$before` (up to its `SELECT`), then the columns of
/// action `a` (`status` as an [`ActionStatus`]) with its approval's id, then `$after` (its
/// `FROM …`, which names the action `a`).
macro_rules! query_actions {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            ActionRecord,
            $before
                + r#" a.id, a.item_id, a.task_id, a.run_id, a.kind, a.proposal, a.calls,
                      a.target, a.status AS "status: ActionStatus", a.proposed_by,
                      a.proposed_by_run_id, a.response, a.artifact_id, a.last_error_code,
                      a.last_error, a.created_at, a.decided_at, a.sending_at, a.finished_at,
                      a.updated_at,
                      (SELECT p.id FROM approvals p
                       WHERE p.workspace_id = a.workspace_id AND p.external_action_id = a.id)
                          AS approval_id "#
                + $after
            $(, $arg)*
        )
    };
}

/// A proposal to record.
#[derive(Debug, Clone)]
pub(crate) struct NewAction<'a> {
    pub(crate) id: &'a str,
    pub(crate) item_id: &'a str,
    pub(crate) task_id: &'a str,
    pub(crate) run_id: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) proposal: &'a serde_json::Value,
    pub(crate) calls: &'a serde_json::Value,
    pub(crate) target: &'a serde_json::Value,
    pub(crate) proposed_by: &'a str,
    pub(crate) proposed_by_run_id: Option<&'a str>,
}

/// Records a proposal, `pending_approval`; its approval is created next, by the caller.
pub async fn insert(
    conn: &mut PgConnection,
    scope: &Scope,
    action: &NewAction<'_>,
) -> Result<ActionRecord> {
    let row = query_actions!(
        "WITH a AS (
             INSERT INTO external_actions (id, workspace_id, item_id, task_id, run_id, kind,
                                           proposal, calls, target, status, proposed_by,
                                           proposed_by_run_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending_approval', $10, $11)
             RETURNING *)
         SELECT",
        "FROM a",
        action.id,
        scope.workspace(),
        action.item_id,
        action.task_id,
        action.run_id,
        action.kind,
        action.proposal,
        action.calls,
        action.target,
        action.proposed_by,
        action.proposed_by_run_id,
    )
    .fetch_one(conn)
    .await?;
    Ok(row)
}

pub async fn get(conn: &mut PgConnection, scope: &Scope, id: &str) -> Result<ActionRecord> {
    query_actions!(
        "SELECT",
        "FROM external_actions a WHERE a.workspace_id = $1 AND a.id = $2",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("external action"))
}

/// Locks an action for the rest of the transaction; None when it is gone.
pub(crate) async fn lock(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<Option<ActionRecord>> {
    let row = query_actions!(
        "SELECT",
        "FROM external_actions a WHERE a.workspace_id = $1 AND a.id = $2 FOR UPDATE OF a",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(row)
}

/// An item's actions, oldest first.
pub(crate) async fn list_for_item(
    conn: &mut PgConnection,
    scope: &Scope,
    item_id: &str,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<ActionRecord>> {
    let rows = query_actions!(
        "SELECT",
        "FROM external_actions a
         WHERE a.workspace_id = $1 AND a.item_id = $2 AND ($3::text IS NULL OR a.id > $3)
         ORDER BY a.id LIMIT $4",
        scope.workspace(),
        item_id,
        after,
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// How many of a source's actions are in each status.
pub(crate) async fn counts_for_source(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
) -> Result<BTreeMap<String, i64>> {
    let rows = sqlx::query!(
        r#"SELECT a.status, count(*) AS "count!" FROM external_actions a
           JOIN external_work_items i ON i.id = a.item_id AND i.workspace_id = a.workspace_id
           WHERE a.workspace_id = $1 AND i.source_id = $2 GROUP BY a.status"#,
        scope.workspace(),
        source_id,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.status, row.count))
        .collect())
}

/// The operator's decision, from the approval's resolution (in its transaction): approved
/// queues the sending job, rejected ends the action with nothing sent.
pub(crate) async fn decide(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    approved: bool,
) -> Result<ActionRecord> {
    let action = lock(conn, scope, id)
        .await?
        .ok_or(StoreError::NotFound("external action"))?;
    if action.status != ActionStatus::PendingApproval {
        return Err(StoreError::Conflict(format!(
            "external action {id} is {}, not pending approval",
            action.status
        )));
    }
    let status = if approved {
        ActionStatus::Approved
    } else {
        ActionStatus::Rejected
    };
    let action = update(conn, scope, id, status, &Outcome::default()).await?;
    if approved {
        queue::enqueue(conn, scope, JobKind::ExternalAction.as_str(), id, 0).await?;
    }
    Ok(action)
}

/// Applies an operator's decision to `found`, an action's approval that
/// [`approvals::decidable`] found for them: the approval is settled and the action approved
/// (its sending queued) or rejected; its run is left as it is. Locks the approval, then
/// the action.
pub(crate) async fn resolve_approval(
    conn: &mut PgConnection,
    scope: &Scope,
    found: &ApprovalRecord,
    action_id: &str,
    decision: Decision,
    note: Option<&str>,
    actor: &Actor,
) -> Result<(ApprovalRecord, RunRecord)> {
    let approval = approvals::lock_pending(conn, scope, &found.id).await?;
    let to = approvals::settled_status(decision);
    let approval =
        approvals::settle_decided(conn, scope, &approval.id, to, note, false, actor).await?;
    decide(conn, scope, action_id, decision == Decision::Approve).await?;
    let run = runs::get(conn, scope, &approval.task_id, &approval.run_id).await?;
    let event = approvals::resolved_event(&approval, actor);
    events::append(conn, scope, &[event]).await?;
    Ok((approval, run))
}

/// What an attempt leaves on its action besides its status.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outcome<'a> {
    pub(crate) response: Option<&'a serde_json::Value>,
    pub(crate) artifact_id: Option<&'a str>,
    /// `(code, message)`; None clears the last error.
    pub(crate) error: Option<(&'a str, &'a str)>,
}

/// Moves an action to `status`, stamping the time of its step.
pub async fn update(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    status: ActionStatus,
    outcome: &Outcome<'_>,
) -> Result<ActionRecord> {
    let (code, message) = outcome.error.unzip();
    let row = query_actions!(
        "WITH a AS (
             UPDATE external_actions
             SET status = $3, response = coalesce($4, response),
                 artifact_id = coalesce($5, artifact_id), last_error_code = $6,
                 last_error = $7, updated_at = now(),
                 decided_at = CASE WHEN status = 'pending_approval' THEN now()
                                   ELSE decided_at END,
                 sending_at = CASE WHEN $3 = 'sending' AND status <> 'sending' THEN now()
                                   ELSE sending_at END,
                 finished_at = CASE WHEN $3 IN ('sent', 'stale_target', 'failed', 'rejected')
                                    THEN now() END
             WHERE workspace_id = $1 AND id = $2 RETURNING *)
         SELECT",
        "FROM a",
        scope.workspace(),
        id,
        status.as_str(),
        outcome.response,
        outcome.artifact_id,
        code,
        message,
    )
    .fetch_one(conn)
    .await?;
    Ok(row)
}
