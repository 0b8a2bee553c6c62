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
use crate::external::{self, actions::Step, workflow::load_workflow};
use crate::queue;
use crate::runs::{self, RunRecord};
use keel_api_types::{ActionStatus, ErrorCode};

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
                      a.updated_at, a.execute_requested_at, a.execute_requested_by,
                      a.cancelled_by, a.cancel_reason,
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

/// Which of a workspace's actions to list: each filter given narrows the list.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ActionFilter<'a> {
    pub(crate) status: Option<ActionStatus>,
    pub(crate) kind: Option<&'a str>,
    pub(crate) item_id: Option<&'a str>,
    pub(crate) source_id: Option<&'a str>,
}

/// A workspace's actions, oldest first.
pub(crate) async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    filter: ActionFilter<'_>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<ActionRecord>> {
    let rows = query_actions!(
        "SELECT",
        "FROM external_actions a
         WHERE a.workspace_id = $1 AND ($2::text IS NULL OR a.id > $2)
           AND ($3::text IS NULL OR a.status = $3) AND ($4::text IS NULL OR a.kind = $4)
           AND ($5::text IS NULL OR a.item_id = $5)
           AND ($6::text IS NULL OR a.item_id IN (
                SELECT i.id FROM external_work_items i
                WHERE i.workspace_id = $1 AND i.source_id = $6))
         ORDER BY a.id LIMIT $7",
        scope.workspace(),
        after,
        filter.status.map(ActionStatus::as_str),
        filter.kind,
        filter.item_id,
        filter.source_id,
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
/// waits for its execute, or is executed at once when its workflow says so
/// (`execute_now`); rejected ends the action with nothing sent.
pub(crate) async fn decide(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    approved: bool,
    execute_now: Option<&Actor>,
) -> Result<ActionRecord> {
    let step = if approved {
        Step::Approve
    } else {
        Step::Reject
    };
    let (action, status) = locked_for(conn, scope, id, step).await?;
    let action = update(conn, scope, &action.id, status, &Outcome::default()).await?;
    match execute_now {
        Some(actor) if approved => request_execute(conn, scope, &action, actor).await,
        _ => Ok(action),
    }
}

/// Asks for an approved action's sending: its `external_action` job is queued once, however
/// often this is asked. 409 `action_not_executable` for any other status.
pub(crate) async fn execute(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    actor: &Actor,
) -> Result<ActionRecord> {
    let (action, _) = locked_for(conn, scope, id, Step::Execute).await?;
    match action.execute_requested_at {
        Some(_) => Ok(action),
        None => request_execute(conn, scope, &action, actor).await,
    }
}

async fn request_execute(
    conn: &mut PgConnection,
    scope: &Scope,
    action: &ActionRecord,
    actor: &Actor,
) -> Result<ActionRecord> {
    let row = query_actions!(
        "WITH a AS (
             UPDATE external_actions
             SET execute_requested_at = now(), execute_requested_by = $3, updated_at = now()
             WHERE workspace_id = $1 AND id = $2 RETURNING *)
         SELECT",
        "FROM a",
        scope.workspace(),
        action.id,
        actor.to_string(),
    )
    .fetch_one(&mut *conn)
    .await?;
    queue::enqueue(conn, scope, JobKind::ExternalAction.as_str(), &action.id, 0).await?;
    Ok(row)
}

/// Cancels a pending or approved action: nothing is sent, and a pending approval is
/// rejected with the reason. 409 `action_not_cancellable` once it is being sent or ended.
pub(crate) async fn cancel(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    reason: Option<&str>,
    actor: &Actor,
) -> Result<ActionRecord> {
    let (action, _) = locked_for(conn, scope, id, Step::Cancel).await?;
    if action.status == ActionStatus::PendingApproval
        && let Some(approval_id) = &action.approval_id
    {
        let note = format!(
            "the action was cancelled: {}",
            reason.unwrap_or("no reason given")
        );
        let approval = approvals::lock_pending(conn, scope, approval_id).await?;
        let approval = approvals::settle_decided(
            conn,
            scope,
            &approval.id,
            approvals::settled_status(Decision::Reject),
            Some(&note),
            false,
            actor,
        )
        .await?;
        let event = approvals::resolved_event(&approval, actor);
        events::append(conn, scope, &[event]).await?;
    }
    let row = query_actions!(
        "WITH a AS (
             UPDATE external_actions
             SET status = 'cancelled', cancelled_by = $3, cancel_reason = $4,
                 decided_at = coalesce(decided_at, now()), finished_at = now(),
                 updated_at = now()
             WHERE workspace_id = $1 AND id = $2 RETURNING *)
         SELECT",
        "FROM a",
        scope.workspace(),
        id,
        actor.to_string(),
        reason,
    )
    .fetch_one(conn)
    .await?;
    Ok(row)
}

/// Locks an action and checks that `step` applies to it: the action and the status it
/// moves to.
async fn locked_for(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    step: Step,
) -> Result<(ActionRecord, ActionStatus)> {
    let action = lock(conn, scope, id)
        .await?
        .ok_or(StoreError::NotFound("external action"))?;
    match step.moves(action.status) {
        Ok(status) => Ok((action, status)),
        Err(why) => {
            let message = format!("external action {id} {why}");
            Err(match step {
                Step::Execute => StoreError::Refused {
                    code: ErrorCode::ActionNotExecutable,
                    message,
                },
                Step::Cancel => StoreError::Refused {
                    code: ErrorCode::ActionNotCancellable,
                    message,
                },
                Step::Approve | Step::Reject => StoreError::conflict_next(
                    message,
                    format!("See where the action stands: keel external-work actions show {id}."),
                ),
            })
        }
    }
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
    let approved = decision == Decision::Approve;
    let executes = approved && executes_on_approval(conn, scope, action_id).await?;
    decide(conn, scope, action_id, approved, executes.then_some(actor)).await?;
    let run = runs::get(conn, scope, &approval.task_id, &approval.run_id).await?;
    let event = approvals::resolved_event(&approval, actor);
    events::append(conn, scope, &[event]).await?;
    Ok((approval, run))
}

/// Whether the action's source's workflow sets `actions.execute_on_approval`; a workflow
/// that cannot be read now does not (its action waits for an execute, which says why).
async fn executes_on_approval(
    conn: &mut PgConnection,
    scope: &Scope,
    action_id: &str,
) -> Result<bool> {
    let action = get(conn, scope, action_id).await?;
    let item = external::get_item(conn, scope, &action.item_id).await?;
    let source = external::get_source(conn, scope, &item.source_id).await?;
    Ok(load_workflow(&source).is_ok_and(|w| w.config.execute_on_approval))
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
