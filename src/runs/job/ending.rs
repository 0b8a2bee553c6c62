//! How an attempt of a run ends: its terminal state (or its wait for an approval), the
//! rows its context still held and, for an agent loop, its conversation, written with the
//! ack in one transaction.

use std::time::Duration;

use keel_workers::Outcome;
use sqlx::{PgConnection, PgPool};

use super::context::{FencedContext, Held, Written};
use crate::approvals;
use crate::approvals::Gate;
use crate::approvals::{ActionSummary, ApprovalKind};
use crate::artifacts;
use crate::attempt;
use crate::attempt::fence::DomainRow;
use crate::attempt::{Attempted, Failure, Verdict};
use crate::db::StoreError;
use crate::domain::{Actor, EventType, RunStatus, Scope};
use crate::events::{NewEvent, Subject};
use crate::queue::{Disposition, Lease};
use crate::runs;
use crate::runs::lineage::{Conversation, write_conversation};
use crate::runs::{Change, Move, RunWithTask};

impl DomainRow for RunWithTask {
    /// One statement: the lease's check, then the run.
    async fn lock(conn: &mut PgConnection, lease: &Lease) -> Result<Option<Self>, StoreError> {
        runs::lock_with_task(conn, lease).await
    }

    fn has_ended(&self) -> bool {
        self.run.status().is_terminal()
    }
}

/// How an attempt that ran to its end leaves the run, with the rows its context still
/// held (written in the same transaction).
pub(crate) struct RunEnding {
    held: Held,
    written: Written,
    /// An agent loop's conversation, written as its `agent_conversation` artifact.
    conversation: Option<Conversation>,
    end: End,
}

pub(crate) enum End {
    Completed {
        exit_code: Option<i32>,
    },
    Failed {
        exit_code: Option<i32>,
        error: String,
    },
    /// An agent loop's tool calls (those of the `model_call` step `step_id`) wait for an
    /// approval: the run holds no lease meanwhile.
    AwaitingApproval {
        summary: ActionSummary,
        step_id: String,
        ttl: Option<Duration>,
    },
}

impl RunEnding {
    pub(crate) fn new(held: Held, end: End) -> RunEnding {
        RunEnding {
            held,
            written: Written::default(),
            conversation: None,
            end,
        }
    }

    pub(crate) fn with_conversation(mut self, conversation: Option<Conversation>) -> RunEnding {
        self.conversation = conversation;
        self
    }
}

impl RunWithTask {
    /// This attempt's move to `running`, and its `run.started`.
    fn started<'a>(&'a self, lease: &'a Lease, actor: &'a Actor) -> (Move<'a>, NewEvent<'a>) {
        let run = &self.run;
        // The transition counts the attempt: this is the one it makes.
        let data = serde_json::json!({ "attempt": run.attempt + 1, "worker_id": lease.owner });
        let event = NewEvent::new(&run.task_id, &run.id, EventType::RunStarted).with(data);
        let moved = Move {
            next: RunStatus::Running,
            change: Change {
                worker_id: Some(&lease.owner),
                ..Change::default()
            },
            actor,
            reason: Some("claimed"),
        };
        (moved, event)
    }

    /// Leaves the run waiting for an approval of an agent loop's tool calls instead of
    /// ending it, and opens the gate; returns its `approval.requested`, which the caller
    /// appends last, as `approvals::create` asks.
    async fn wait_for_approval<'a>(
        &'a self,
        conn: &mut PgConnection,
        scope: &Scope,
        lease: &Lease,
        summary: &ActionSummary,
        step_id: &str,
        ttl: Option<Duration>,
    ) -> Result<NewEvent<'a>, StoreError> {
        let actor = attempt::worker(lease);
        let (waiting, reason) = (RunStatus::AwaitingApproval, "tool calls need approval");
        let change = Change::default();
        let run = runs::transition_locked(
            conn,
            scope,
            &self.run,
            waiting,
            change,
            &actor,
            Some(reason),
        )
        .await?;
        let gate = Gate {
            kind: ApprovalKind::AgentLoopToolCall,
            step_id: Some(step_id),
        };
        let approval = approvals::create(conn, scope, &run, gate, summary, ttl, &actor).await?;
        let data = approvals::requested_data(&approval);
        let (task_id, run_id) = (&self.run.task_id, &self.run.id);
        Ok(NewEvent::new(task_id, run_id, EventType::ApprovalRequested).with(data))
    }
}

impl Attempted for RunWithTask {
    type Ending = RunEnding;
    type Context = ();

    fn is_running(&self) -> bool {
        self.run.status() == RunStatus::Running
    }

    fn gave_up(&self, _: &(), error: String, _: Option<&Failure>) -> Option<RunEnding> {
        let failed = End::Failed {
            exit_code: None,
            error,
        };
        Some(RunEnding::new(Held::default(), failed))
    }

    fn label(ending: &RunEnding) -> &'static str {
        match ending.end {
            End::Completed { .. } => "completed",
            End::Failed { .. } => "failed",
            End::AwaitingApproval { .. } => "awaiting_approval",
        }
    }

    async fn requeue_lost<'r>(
        &'r self,
        conn: &mut PgConnection,
        scope: &Scope,
        reason: &'static str,
        actor: &Actor,
    ) -> Result<(Self, Vec<NewEvent<'r>>), StoreError> {
        let (run, events) = runs::requeue_lost(conn, scope, &self.run, reason, actor).await?;
        Ok((self.with_run(run), events))
    }

    async fn read_lost(conn: &mut PgConnection, lease: &Lease) -> Result<Option<Self>, StoreError> {
        runs::read_with_task(conn, lease).await
    }

    /// A queued run: read, then started by one statement that checks the lease and the
    /// status read, and appends `run.started`.
    async fn start_waiting(pool: &PgPool, lease: &Lease) -> Result<Option<Self>, StoreError> {
        let mut conn = pool.acquire().await?;
        let Some(row) = runs::read_with_task(&mut conn, lease).await? else {
            return Ok(None);
        };
        if row.run.status() != RunStatus::Queued {
            return Ok(None);
        }
        let actor = attempt::worker(lease);
        let (moved, event) = row.started(lease, &actor);
        let run = runs::transition_fenced(&mut conn, lease, &row.run, moved, &[event]).await?;
        Ok(run.map(|run| row.with_run(run)))
    }

    /// Appends its `run.started` in the statement that marks the run running.
    async fn start<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
    ) -> Result<(Self, Vec<NewEvent<'r>>), StoreError> {
        let (scope, actor) = (lease.scope(), attempt::worker(lease));
        let (moved, event) = self.started(lease, &actor);
        let run = runs::transition_recorded(conn, &scope, &self.run, moved, &[event]).await?;
        Ok((self.with_run(run), Vec::new()))
    }

    /// Every ending completes the job: a run waiting for an approval holds no lease.
    fn disposition(_: &RunEnding) -> Disposition {
        Disposition::Complete
    }

    async fn end<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        ending: &'r mut RunEnding,
    ) -> Result<Vec<NewEvent<'r>>, StoreError> {
        let (scope, run) = (lease.scope(), &self.run);
        let ids = (run.task_id.as_str(), run.id.as_str());
        // What an earlier try of this transaction wrote was rolled back with it.
        ending.written = Written::default();
        ending
            .held
            .write(conn, &scope, ids, &mut ending.written)
            .await?;
        let ending: &'r RunEnding = ending;
        let owner = Subject::Run {
            task_id: &run.task_id,
            run_id: &run.id,
        };
        let mut events = ending.written.events(owner);
        if let Some(conversation) = &ending.conversation {
            let written = write_conversation(conn, &scope, owner, conversation).await?;
            events.extend(artifacts::created_event(owner, &written));
        }
        let (next, change, reason, event) = match &ending.end {
            End::Completed { exit_code } => {
                let answer = ending.conversation.as_ref();
                let change = Change {
                    exit_code: *exit_code,
                    answer: answer.and_then(|conversation| conversation.answer.as_deref()),
                    ..Change::default()
                };
                let data = serde_json::json!({ "exit_code": exit_code });
                let event = NewEvent::new(&run.task_id, &run.id, EventType::RunFinished).with(data);
                (RunStatus::Completed, change, "process exited 0", event)
            }
            End::Failed { exit_code, error } => {
                let change = Change {
                    exit_code: *exit_code,
                    last_error: Some(error),
                    ..Change::default()
                };
                let data = serde_json::json!({ "exit_code": exit_code, "error": error });
                let event = NewEvent::new(&run.task_id, &run.id, EventType::RunFailed).with(data);
                (RunStatus::Failed, change, error.as_str(), event)
            }
            End::AwaitingApproval {
                summary,
                step_id,
                ttl,
            } => {
                let requested = self
                    .wait_for_approval(conn, &scope, lease, summary, step_id, *ttl)
                    .await?;
                events.push(requested);
                return Ok(events);
            }
        };
        // The end is the transaction's last write: it carries every event of the attempt.
        events.push(event);
        let actor = attempt::worker(lease);
        let moved = Move {
            next,
            change,
            actor: &actor,
            reason: Some(reason),
        };
        runs::transition_recorded(conn, &scope, run, moved, &events).await?;
        Ok(Vec::new())
    }

    async fn requeue<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        failure: &'r Failure,
        _: Duration,
    ) -> Result<Vec<NewEvent<'r>>, StoreError> {
        let (scope, run, error) = (lease.scope(), &self.run, &failure.message);
        let (queued, actor) = (RunStatus::Queued, attempt::worker(lease));
        let change = Change::default();
        runs::transition_locked(conn, &scope, run, queued, change, &actor, Some(error)).await?;
        runs::close_open_work(conn, &scope, &run.id, "failed", error).await?;
        let data = serde_json::json!({ "reason": "retry", "error": error });
        Ok(vec![
            NewEvent::new(&run.task_id, &run.id, EventType::RunQueued).with(data),
        ])
    }
}

impl FencedContext {
    /// How the attempt leaves the run, with the rows the context still holds (and for an
    /// agent loop, its conversation).
    pub(crate) async fn verdict(
        &self,
        outcome: Outcome,
        conversation: Option<Conversation>,
    ) -> Verdict<RunEnding> {
        let end = match outcome {
            Outcome::Completed { exit_code } => End::Completed { exit_code },
            Outcome::Failed { exit_code, error } => End::Failed { exit_code, error },
            // What the context held back goes: the retry runs the attempt again.
            Outcome::Retry { error } => return Verdict::Retry(Failure::runtime(error)),
            Outcome::Interrupted => return Verdict::Interrupted,
        };
        self.ended(end, conversation).await
    }

    /// An agent loop's attempt that stopped for an approval of the tool calls model call
    /// step `step_id` asked for: the run waits, its gate open for `ttl`.
    pub(crate) async fn awaiting_approval(
        &self,
        summary: ActionSummary,
        step_id: String,
        ttl: Option<Duration>,
        conversation: Option<Conversation>,
    ) -> Verdict<RunEnding> {
        let end = End::AwaitingApproval {
            summary,
            step_id,
            ttl,
        };
        self.ended(end, conversation).await
    }

    async fn ended(&self, end: End, conversation: Option<Conversation>) -> Verdict<RunEnding> {
        let held = std::mem::take(&mut *self.shared.held.lock().await);
        Verdict::Ended(RunEnding::new(held, end).with_conversation(conversation))
    }
}
