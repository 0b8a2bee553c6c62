//! Approvals: gates that hold a run in `awaiting_approval` until an operator decides, or
//! hold an external action until one approves it. This is the approval's own row: opened
//! with its run's admission or an agent attempt's end (or an action's proposal), listed,
//! settled, cancelled with its run. What a decision does to its subject is the subject's:
//! a run's gates are resolved by `runs::resolve_gate`, an action's approval by
//! `external::actions::resolve_approval`, each in one transaction.

use std::time::Duration;

use sqlx::PgConnection;

use crate::approvals::{ActionSummary, ApprovalKind, Decision};
use crate::db::{Result, StoreError};
use crate::domain::{Actor, EventType, Scope, new_id};
use crate::events::NewEvent;
use crate::events::transitions;
use crate::events::transitions::Transition;

pub(crate) use keel_api_types::ApprovalRecord;
use keel_api_types::{ApprovalStatus, ListOrder, RunRecord};

/// `query_as!` of [`ApprovalRecord`]s: `$before` (up to its `SELECT` or `RETURNING`), then
/// the approval's columns, then `$after` (its `FROM …`, or nothing). `status` is an
/// [`ApprovalStatus`]: `stored:` as the row holds it (one just written), `read:` with a
/// pending approval past its `expires_at` as `expired`.
macro_rules! query_approvals {
    (stored: $before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        query_approvals!(
            @status r#"status AS "status: ApprovalStatus""#, $before, $after $(, $arg)*
        )
    };
    (read: $before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        query_approvals!(
            @status r#"CASE WHEN status = 'pending' AND expires_at <= now() THEN 'expired'
                            ELSE status END AS "status!: ApprovalStatus""#,
            $before, $after $(, $arg)*
        )
    };
    (@status $status:literal, $before:literal, $after:literal $(, $arg:expr)*) => {
        sqlx::query_as!(
            ApprovalRecord,
            $before
                + " id, task_id, run_id, kind, "
                + $status
                + ", action_summary, action_summary_incomplete, step_id, continue_on_reject,
                   external_action_id, decision_note, requested_by, resolved_by, created_at,
                   expires_at, resolved_at "
                + $after
            $(, $arg)*
        )
    };
}

/// Who decides an approval, and whether they may decide one they requested.
#[derive(Debug, Clone)]
pub struct Approver {
    pub actor: Actor,
    /// Local mode, or remote mode with `KEEL_ALLOW_SELF_APPROVAL`.
    pub may_approve_own: bool,
}

/// What an approval gates: a kind, and for a tool-call approval the `model_call` step
/// whose calls it covers.
#[derive(Debug, Clone, Copy)]
pub struct Gate<'a> {
    pub(crate) kind: ApprovalKind,
    pub(crate) step_id: Option<&'a str>,
}

/// Opens a pending approval on a run (inside its admission transaction, or an agent
/// attempt's end). The caller appends the `approval.requested` event last.
pub async fn create(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &RunRecord,
    gate: Gate<'_>,
    summary: &ActionSummary,
    ttl: Option<Duration>,
    actor: &Actor,
) -> Result<ApprovalRecord> {
    let approval = insert(conn, scope, run, gate, None, summary, ttl, None).await?;
    let reason = match gate.step_id {
        Some(_) => "tool calls gated by the approval policy",
        None => "run gated by the approval policy",
    };
    record(conn, scope, &approval, None, "pending", Some(reason), actor).await?;
    Ok(approval)
}

/// Opens the pending approval of an external action, attached to the action's task and
/// run without holding the run. It does not expire: the action's target is checked again
/// when it is sent. The caller appends the `approval.requested` event last.
pub(crate) async fn create_for_action(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &RunRecord,
    action_id: &str,
    summary: &ActionSummary,
    actor: &Actor,
) -> Result<ApprovalRecord> {
    let gate = Gate {
        kind: ApprovalKind::ExternalAction,
        step_id: None,
    };
    let proposer = actor.to_string();
    let approval = insert(
        conn,
        scope,
        run,
        gate,
        Some(action_id),
        summary,
        None,
        Some(&proposer),
    )
    .await?;
    let reason = Some("a write to the tracker, proposed");
    record(conn, scope, &approval, None, "pending", reason, actor).await?;
    Ok(approval)
}

/// Opens the approval row. Its requester is `requested_by`, else its run's requester.
#[allow(clippy::too_many_arguments)]
async fn insert(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &RunRecord,
    gate: Gate<'_>,
    external_action_id: Option<&str>,
    summary: &ActionSummary,
    ttl: Option<Duration>,
    requested_by: Option<&str>,
) -> Result<ApprovalRecord> {
    let ttl_ms = ttl.map(|t| i64::try_from(t.as_millis()).unwrap_or(i64::MAX));
    // Just inserted as pending with a TTL in the future: it reads as stored.
    let approval = query_approvals!(stored:
        "INSERT INTO approvals (id, task_id, run_id, kind, status, action_summary,
                                action_summary_incomplete, expires_at, workspace_id, step_id,
                                external_action_id, requested_by)
         VALUES ($1, $2, $3, $4, 'pending', $5, $6,
                 now() + $7::bigint * interval '1 millisecond', $8, $9, $10,
                 COALESCE($11, (SELECT requested_by FROM runs
                                WHERE workspace_id = $8 AND id = $3)))
         RETURNING",
        "",
        new_id("apr"),
        run.task_id,
        run.id,
        gate.kind.as_str(),
        summary.lines.as_slice(),
        summary.incomplete,
        ttl_ms,
        scope.workspace(),
        gate.step_id,
        external_action_id,
        requested_by,
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(approval)
}

async fn record(
    conn: &mut PgConnection,
    scope: &Scope,
    approval: &ApprovalRecord,
    from: Option<&str>,
    to: &str,
    reason: Option<&str>,
    actor: &Actor,
) -> Result<()> {
    let transition = Transition {
        entity_type: "approval",
        entity_id: &approval.id,
        task_id: Some(&approval.task_id),
        from,
        to,
        reason,
    };
    transitions::record(conn, scope, transition, actor).await
}

/// The feed carries the approval's id and kind but never its summary (seed 004): the feed
/// reaches every reader of the workspace, the summary only those who fetch the approval.
pub(crate) fn requested_event(approval: &ApprovalRecord) -> NewEvent<'_> {
    NewEvent::new(
        &approval.task_id,
        &approval.run_id,
        EventType::ApprovalRequested,
    )
    .with(requested_data(approval))
}

/// The data of an `approval.requested` event.
pub(crate) fn requested_data(approval: &ApprovalRecord) -> serde_json::Value {
    serde_json::json!({
        "approval_id": approval.id,
        "kind": approval.kind,
        "step_id": approval.step_id,
        "expires_at": approval.expires_at,
    })
}

pub async fn get(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    approval_id: &str,
) -> Result<ApprovalRecord> {
    // A pending approval past its `expires_at` reads as `expired`.
    query_approvals!(read:
        "SELECT",
        "FROM approvals WHERE workspace_id = $3 AND task_id = $1 AND id = $2",
        task_id,
        approval_id,
        scope.workspace(),
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("approval"))
}

/// Which approvals [`list`] reads: each filter that is Some narrows the list.
#[derive(Debug, Default, Clone, Copy)]
pub struct ApprovalFilter<'a> {
    pub task_id: Option<&'a str>,
    pub run_id: Option<&'a str>,
    pub status: Option<&'a str>,
}

/// [`list`]'s first page, oldest first.
pub const OLDEST_FIRST: (ListOrder, Option<&str>) = (ListOrder::Asc, None);

/// Approvals of the workspace (the inbox), of one task or of one run; oldest first, or
/// newest first with [`ListOrder::Desc`]. `after` is the id of the previous page's last.
pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    filter: ApprovalFilter<'_>,
    (order, after): (ListOrder, Option<&str>),
    limit: i64,
) -> Result<Vec<ApprovalRecord>> {
    // A pending approval past its `expires_at` reads as `expired`, and is filtered as one.
    macro_rules! page {
        ($bound:literal, $order:literal) => {
            sqlx::query_as!(
                ApprovalRecord,
                r#"SELECT a.id, a.task_id, a.run_id, a.kind, a.status AS "status!: ApprovalStatus",
                          a.action_summary, a.action_summary_incomplete, a.step_id,
                          a.continue_on_reject, a.external_action_id, a.decision_note,
                          a.requested_by, a.resolved_by, a.created_at, a.expires_at,
                          a.resolved_at
                   FROM (SELECT id, task_id, run_id, kind,
                                CASE WHEN status = 'pending' AND expires_at <= now() THEN 'expired'
                                     ELSE status END AS status,
                                action_summary, action_summary_incomplete, step_id,
                                continue_on_reject, external_action_id, decision_note,
                                requested_by, resolved_by, created_at, expires_at, resolved_at
                         FROM approvals WHERE workspace_id = $5) a
                   WHERE ($1::text IS NULL OR a.task_id = $1) AND ($2::text IS NULL OR a.status = $2)
                     AND ($6::text IS NULL OR a.run_id = $6) AND "# + $bound + r#"
                   ORDER BY a.id "# + $order + r#" LIMIT $4"#,
                filter.task_id,
                filter.status,
                // Every id is greater than '': the first page's bound is an index bound too.
                match order {
                    ListOrder::Asc => Some(after.unwrap_or_default()),
                    ListOrder::Desc => after,
                },
                limit,
                scope.workspace(),
                filter.run_id,
            )
            .fetch_all(conn)
            .await?
        };
    }
    let rows = match (order, after) {
        (ListOrder::Asc, _) => page!("a.id > $3", "ASC"),
        (ListOrder::Desc, None) => page!("$3::text IS NULL", "DESC"),
        (ListOrder::Desc, Some(_)) => page!("a.id < $3", "DESC"),
    };
    Ok(rows)
}

/// Who requested what an approval gates, if it is known.
async fn requester(
    conn: &mut PgConnection,
    scope: &Scope,
    approval_id: &str,
) -> Result<Option<String>> {
    let requested_by = sqlx::query_scalar!(
        "SELECT requested_by FROM approvals WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        approval_id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(requested_by.flatten())
}

/// Refuses an approver deciding their own request (to `what`: resolve its approval, apply
/// a run's patches), unless they may: a second person sees what runs on the workers.
pub(crate) fn check_approver(
    requested_by: Option<&str>,
    approver: &Approver,
    what: &str,
) -> Result<()> {
    let own = requested_by == Some(approver.actor.to_string().as_str());
    if own && !approver.may_approve_own {
        return Err(StoreError::Forbidden(format!(
            "{} requested this; someone else must {what} (KEEL_ALLOW_SELF_APPROVAL lets \
             requesters decide their own)",
            approver.actor
        )));
    }
    Ok(())
}

/// An approval `approver` may decide: found in the scope, and not requested by the approver
/// unless they may approve their own.
pub async fn decidable(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    approval_id: &str,
    approver: &Approver,
) -> Result<ApprovalRecord> {
    let found = get(conn, scope, task_id, approval_id).await?;
    check_approver(
        requester(conn, scope, approval_id).await?.as_deref(),
        approver,
        "resolve its approval",
    )?;
    Ok(found)
}

/// What an approval becomes when `decision` is applied to it.
pub(crate) fn settled_status(decision: Decision) -> &'static str {
    match decision {
        Decision::Approve => "approved",
        Decision::Reject | Decision::RejectAndContinue => "rejected",
    }
}

/// Settles an approval locked by [`lock_pending`] as `to`, with its trail.
pub(crate) async fn settle_decided(
    conn: &mut PgConnection,
    scope: &Scope,
    approval_id: &str,
    to: &str,
    note: Option<&str>,
    continue_on_reject: bool,
    actor: &Actor,
) -> Result<ApprovalRecord> {
    let approval = settle(
        conn,
        scope,
        approval_id,
        to,
        note,
        continue_on_reject,
        actor,
    )
    .await?;
    record(conn, scope, &approval, Some("pending"), to, note, actor).await?;
    Ok(approval)
}

/// The `approval.resolved` event of a settled approval.
pub(crate) fn resolved_event<'a>(approval: &'a ApprovalRecord, actor: &Actor) -> NewEvent<'a> {
    let mut data = serde_json::json!({ "approval_id": approval.id, "kind": approval.kind,
                                       "decision": approval.status,
                                       "continue": approval.continue_on_reject,
                                       "note": approval.decision_note,
                                       "resolved_by": actor.to_string() });
    if let Some(action_id) = &approval.external_action_id {
        data["external_action_id"] = action_id.as_str().into();
    }
    NewEvent::new(
        &approval.task_id,
        &approval.run_id,
        EventType::ApprovalResolved,
    )
    .with(data)
}

/// Locks an approval that is still pending; a conflict when it was resolved or expired.
pub(crate) async fn lock_pending(
    conn: &mut PgConnection,
    scope: &Scope,
    approval_id: &str,
) -> Result<ApprovalRecord> {
    // A pending approval past its `expires_at` reads as `expired`.
    let approval = query_approvals!(read:
        "SELECT",
        "FROM approvals WHERE workspace_id = $1 AND id = $2 FOR UPDATE",
        scope.workspace(),
        approval_id,
    )
    .fetch_one(&mut *conn)
    .await?;
    if approval.status != ApprovalStatus::Pending {
        return Err(StoreError::ConflictNext {
            message: format!(
                "approval {approval_id} is {}, not pending; it can no longer be resolved",
                approval.status
            ),
            next: format!(
                "Someone decided it, or it lapsed: read it as it is now (keel approvals show \
                 {approval_id})."
            ),
        });
    }
    Ok(approval)
}

async fn settle(
    conn: &mut PgConnection,
    scope: &Scope,
    approval_id: &str,
    to: &str,
    note: Option<&str>,
    continue_on_reject: bool,
    actor: &Actor,
) -> Result<ApprovalRecord> {
    // Settled: no longer pending, so it reads as stored.
    let approval = query_approvals!(stored:
        "UPDATE approvals SET status = $2, decision_note = $3, resolved_by = $4,
                              resolved_at = now(), continue_on_reject = $6
         WHERE workspace_id = $5 AND id = $1
         RETURNING",
        "",
        approval_id,
        to,
        note,
        actor.to_string(),
        scope.workspace(),
        continue_on_reject,
    )
    .fetch_one(conn)
    .await?;
    Ok(approval)
}

/// How many of a run's gates are still pending (an external action's approval holds none).
pub(crate) async fn pending_count(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
) -> Result<i64> {
    let n = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM approvals
           WHERE workspace_id = $1 AND run_id = $2 AND status = 'pending'
             AND kind <> 'external_action'"#,
        scope.workspace(),
        run_id,
    )
    .fetch_one(conn)
    .await?;
    Ok(n)
}

/// Cancels a run's pending approvals on behalf of the system (the run was cancelled).
pub(crate) async fn cancel_pending(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    reason: &str,
) -> Result<()> {
    let pending = sqlx::query_scalar!(
        "SELECT id FROM approvals
         WHERE workspace_id = $1 AND run_id = $2 AND status = 'pending'
           AND kind <> 'external_action'
         ORDER BY id FOR UPDATE",
        scope.workspace(),
        run_id,
    )
    .fetch_all(&mut *conn)
    .await?;
    for id in pending {
        let approval = settle(
            conn,
            scope,
            &id,
            "cancelled",
            Some(reason),
            false,
            &Actor::System,
        )
        .await?;
        record(
            conn,
            scope,
            &approval,
            Some("pending"),
            "cancelled",
            Some(reason),
            &Actor::System,
        )
        .await?;
    }
    Ok(())
}
