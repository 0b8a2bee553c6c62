//! A run's approval gates, decided: approving its last pending gate queues the run;
//! rejecting any gate cancels the run and its other gates, except a tool-call approval
//! rejected with `continue`, which queues the run (the model then reads a refusal). Rows
//! are locked run first, approval second, the same order cancellation takes them in.

use sqlx::PgConnection;

use crate::approvals::{self, ApprovalRecord, Decision};
use crate::attempt::JobKind;
use crate::db::{Result, StoreError};
use crate::domain::{Actor, EventType, RunStatus, Scope};
use crate::events::{self, NewEvent};
use crate::queue;
use crate::runs::{self, Change, RunRecord};

/// Applies an operator's decision to `found`, a gate of its run that
/// [`approvals::decidable`] found for them, in the caller's transaction.
pub async fn resolve_gate(
    conn: &mut PgConnection,
    scope: &Scope,
    found: &ApprovalRecord,
    decision: Decision,
    note: Option<&str>,
    actor: &Actor,
) -> Result<(ApprovalRecord, RunRecord)> {
    let run_id = &found.run_id;
    let run = runs::lock(conn, scope, run_id).await?;
    let approval = approvals::lock_pending(conn, scope, &found.id).await?;
    if run.status() != RunStatus::AwaitingApproval {
        return Err(StoreError::ConflictNext {
            message: format!("run {run_id} is {}, not awaiting approval", run.status),
            next: format!("Read the run as it is now (keel runs show {run_id})."),
        });
    }
    let to = approvals::settled_status(decision);
    let continues = decision == Decision::RejectAndContinue;
    let approval =
        approvals::settle_decided(conn, scope, &approval.id, to, note, continues, actor).await?;
    let (run, run_event) = match decision {
        Decision::Approve | Decision::RejectAndContinue
            if approvals::pending_count(conn, scope, run_id).await? == 0 =>
        {
            let reason = Some(match decision {
                Decision::RejectAndContinue => "tool calls refused; the loop goes on",
                _ => "all approvals granted",
            });
            let queued = RunStatus::Queued;
            let run = runs::transition(
                conn,
                scope,
                run_id,
                queued,
                Change::default(),
                actor,
                reason,
            )
            .await?;
            let priority = runs::priority_of(conn, scope, run_id).await?;
            queue::enqueue(conn, scope, JobKind::Run.as_str(), run_id, priority).await?;
            (run, Some(EventType::RunQueued))
        }
        Decision::Approve | Decision::RejectAndContinue => (run, None),
        Decision::Reject => {
            let reason = "another approval of the run was rejected";
            approvals::cancel_pending(conn, scope, run_id, reason).await?;
            let change = Change {
                last_error: Some("approval rejected"),
                ..Change::default()
            };
            let (cancelled, why) = (RunStatus::Cancelled, Some("approval rejected"));
            let run = runs::transition(conn, scope, run_id, cancelled, change, actor, why).await?;
            (run, Some(EventType::RunCancelled))
        }
    };
    let task_id = &approval.task_id;
    let mut appended = vec![approvals::resolved_event(&approval, actor)];
    appended.extend(run_event.map(|event| NewEvent::new(task_id, run_id, event)));
    events::append(conn, scope, &appended).await?;
    Ok((approval, run))
}
