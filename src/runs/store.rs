//! Run rows: reads, status transitions with their audit records, and cancellation. A run
//! is created by admission ([`super::admission`]).

use sqlx::PgConnection;
use sqlx::types::Json;

use crate::approvals;
use crate::attempt::JobKind;
use crate::db::{Result, StoreError};
use crate::domain::{Actor, EventType, Role, RunStatus, Scope};
use crate::events;
use crate::events::NewEvent;
use crate::queue::{self, Lease};
use crate::tasks::Hooks;
use crate::tasks::TaskRecord;
use keel_api_types::{ListOrder, TerminalCode};

pub use keel_api_types::RunRecord;

pub async fn get(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    run_id: &str,
) -> Result<RunRecord> {
    query_runs!(
        "",
        "FROM runs WHERE workspace_id = $3 AND task_id = $1 AND id = $2",
        task_id,
        run_id,
        scope.workspace(),
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("run"))
}

pub async fn get_by_id(conn: &mut PgConnection, scope: &Scope, run_id: &str) -> Result<RunRecord> {
    query_runs!(
        "",
        "FROM runs WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        run_id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("run"))
}

/// A run as its worker locks it when an attempt starts, with its task.
#[derive(Debug, Clone)]
pub(crate) struct RunWithTask {
    pub(crate) run: RunRecord,
    pub(crate) task: TaskRecord,
    /// External work: the hooks the task's attempts run around themselves (never part of
    /// the task as the API shows it).
    pub(crate) hooks: Option<Hooks>,
    /// Who wrote the task, which decides the secrets its MCP servers may name.
    pub(crate) written_by: Role,
}

impl RunWithTask {
    /// The same task with the run as it now is.
    pub(crate) fn with_run(&self, run: RunRecord) -> RunWithTask {
        RunWithTask {
            run,
            task: self.task.clone(),
            hooks: self.hooks.clone(),
            written_by: self.written_by,
        }
    }
}

/// `query!` of a run with its task (the columns [`run_with_task!`] reads), then `$after`
/// (`WHERE …` on the run `r`, and a lock).
macro_rules! query_run_with_task {
    ($after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query!(
            r#"SELECT r.id, r.task_id, r.number, r.status AS "status: RunStatus", r.attempt,
                  r.worker_id, r.exit_code, r.last_error, r.retried_from_run_id,
                  r.resumed_from_run_id, r.checkpoint, r.prior_cost_micros_usd,
                  r.total_cost_micros_usd, r.model_call_count, r.abandoned_model_calls, r.model,
                  r.provider, r.workspace_run_id, r.schedule_id, r.schedule_occurrence_id,
                  r.scheduled_for, r.created_at, r.started_at, r.finished_at, r.updated_at,
                  r.lineage_kind, r.from_model_call_index, r.conversation_base, r.requested_by,
                  r.answer, r.terminal_code AS "terminal_code: keel_api_types::TerminalCode",
                  to_jsonb(task) - 'hooks' - 'written_by_role' AS "task!: Json<TaskRecord>",
                  to_jsonb(task) -> 'hooks' AS "hooks!: Json<Option<Hooks>>",
                  task.written_by_role AS "written_by_role!"
         FROM runs r
         CROSS JOIN LATERAL (
             SELECT t.id, t.title, t.execution_kind, COALESCE(latest.status, 'not_started') AS status,
                    t.prompt, t.shell_command, t.git_command, t.file_path, t.file_content,
                    t.file_operation, t.working_directory, t.workspace_mode, t.repo,
                    t.base_branch, t.repo_credential, t.push_branch, t.sandbox_allowed_root, t.sandbox_network, t.sandbox_read_only, t.timeout_ms,
                    t.priority, t.budget_micros_usd, t.system_prompt, t.requested_provider,
                    t.requested_model, t.max_model_calls, t.reasoning_effort,
                    t.workspace_system_prompt_policy, t.tools, t.mcp_servers,
                    t.execution_profile, t.hooks,
                    t.written_by_role, t.run_count,
                    t.latest_run_id,
                    (SELECT count(*) FROM steps s WHERE s.run_id = t.latest_run_id)
                        AS latest_run_step_count,
                    (SELECT count(*) FROM artifacts a WHERE a.run_id = t.latest_run_id)
                        AS latest_run_artifact_count,
                    t.created_at, t.updated_at
             FROM tasks t LEFT JOIN runs latest ON latest.id = t.latest_run_id
             WHERE t.workspace_id = r.workspace_id AND t.id = r.task_id
         ) task "#
                + $after
            $(, $arg)*
        )
    };
}

/// The [`RunWithTask`] of a [`query_run_with_task!`] row.
macro_rules! run_with_task {
    ($row:ident) => {
        RunWithTask {
            run: run_record!($row),
            task: $row.task.0,
            hooks: $row.hooks.0,
            written_by: Role::stored(&$row.written_by_role),
        }
    };
}

/// Locks the run of a job's lease for the rest of the transaction and reads its task, in
/// one statement that first locks the job row, fenced by the lease (`fence_job`, the
/// queue's check, evaluated before the run's row is locked: the order every transaction of
/// a job takes them in). None when the run is gone; `LeaseLost` when the lease is.
pub(crate) async fn lock_with_task(
    conn: &mut PgConnection,
    lease: &Lease,
) -> Result<Option<RunWithTask>> {
    let row = query_run_with_task!(
        "WHERE r.workspace_id = $1 AND r.id = $2 AND fence_job($3, $4, $5)
         FOR UPDATE OF r",
        lease.workspace_id,
        lease.ref_id,
        lease.job_id,
        lease.fencing_token,
        lease.owner,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        // No row: the lease is lost, or the run gone (rare either way).
        queue::fence(conn, lease).await?;
        return Ok(None);
    };
    Ok(Some(run_with_task!(row)))
}

/// The run of a job's lease with its task, as committed, neither locked nor fenced: what a
/// write fenced on its own ([`transition_recorded`] with the lease) starts from.
pub(crate) async fn read_with_task(
    conn: &mut PgConnection,
    lease: &Lease,
) -> Result<Option<RunWithTask>> {
    let row = query_run_with_task!(
        "WHERE r.workspace_id = $1 AND r.id = $2",
        lease.workspace_id,
        lease.ref_id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|row| run_with_task!(row)))
}

/// Sets the conversation an agent loop run starts from, unless it has one: the first
/// attempt keeps what it composed, so every later attempt starts from the same words.
pub(crate) async fn keep_conversation_base(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    base: &serde_json::Value,
) -> Result<()> {
    sqlx::query!(
        "UPDATE runs SET conversation_base = $3, updated_at = now()
         WHERE workspace_id = $1 AND id = $2 AND conversation_base IS NULL",
        scope.workspace(),
        run_id,
        base,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Locks a run row for the rest of the transaction.
pub(crate) async fn lock(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
) -> Result<RunRecord> {
    query_runs!(
        "",
        "FROM runs WHERE workspace_id = $1 AND id = $2 FOR UPDATE",
        scope.workspace(),
        run_id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("run"))
}

pub(crate) async fn priority_of(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
) -> Result<i32> {
    let priority = sqlx::query_scalar!(
        "SELECT t.priority FROM runs r JOIN tasks t ON t.id = r.task_id
         WHERE r.workspace_id = $1 AND r.id = $2",
        scope.workspace(),
        run_id,
    )
    .fetch_one(conn)
    .await?;
    Ok(priority)
}

/// Oldest first; `after` is the id of the last run of the previous page.
pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<RunRecord>> {
    let rows = query_runs!(
        "",
        r#"FROM runs
           WHERE workspace_id = $4 AND task_id = $1 AND ($2::text IS NULL OR id > $2)
           ORDER BY id LIMIT $3"#,
        task_id,
        after,
        limit,
        scope.workspace(),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Which runs of the workspace [`list_in_workspace`] reads.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunFilter<'a> {
    pub status: Option<RunStatus>,
    pub task_id: Option<&'a str>,
}

/// Runs of every task in the workspace, oldest first (newest first with
/// [`ListOrder::Desc`]), as [`list`] pages one task's; `after` is the id of the last run of
/// the previous page. One statement per filter, order and bound, so each reads its own
/// index in id order (`runs_workspace…`, backwards for newest first) and a page costs the
/// same however many runs came before it: a `$n IS NULL OR …` filter would let a generic
/// plan scan past them.
pub async fn list_in_workspace(
    conn: &mut PgConnection,
    scope: &Scope,
    filter: RunFilter<'_>,
    (order, after): (ListOrder, Option<&str>),
    limit: i64,
) -> Result<Vec<RunRecord>> {
    let status = filter.status.map(RunStatus::as_str);
    // The page's bound on the id: every id is greater than '', so the oldest first page's
    // bound is an index bound too; the newest first page has none (its `$2` is null).
    macro_rules! page {
        ($bound:literal, $order:literal, $filter:literal $(, $arg:expr)*) => {
            query_runs!(
                "",
                "FROM runs WHERE workspace_id = $1 AND " + $bound + " AND " + $filter
                    + " ORDER BY id " + $order + " LIMIT $3",
                scope.workspace(),
                match order {
                    ListOrder::Asc => Some(after.unwrap_or_default()),
                    ListOrder::Desc => after,
                },
                limit,
                $($arg,)*
            )
            .fetch_all(&mut *conn)
            .await?
        };
    }
    macro_rules! filtered {
        ($filter:literal $(, $arg:expr)*) => {
            match (order, after) {
                (ListOrder::Asc, _) => page!("id > $2", "ASC", $filter $(, $arg)*),
                (ListOrder::Desc, None) => page!("$2::text IS NULL", "DESC", $filter $(, $arg)*),
                (ListOrder::Desc, Some(_)) => page!("id < $2", "DESC", $filter $(, $arg)*),
            }
        };
    }
    let rows = match (filter.task_id, status) {
        (None, None) => filtered!("true"),
        (None, Some(status)) => filtered!("status = $4", status),
        // A task's runs, then its status: the task's own runs are all there is to read.
        (Some(task_id), status) => {
            filtered!(
                "task_id = $4 AND ($5::text IS NULL OR status = $5)",
                task_id,
                status
            )
        }
    };
    Ok(rows)
}

/// What a transition records besides the new status.
#[derive(Debug, Clone, Default)]
pub struct Change<'a> {
    pub(crate) worker_id: Option<&'a str>,
    pub(crate) exit_code: Option<i32>,
    pub(crate) last_error: Option<&'a str>,
    /// An agent loop's answer, kept when it completes.
    pub(crate) answer: Option<&'a str>,
}

/// Moves a run to `next` if the state machine allows it from the run's current state
/// (otherwise a conflict, and nothing changes), and records the change of the run and of
/// its task's projection in the audit trail.
pub async fn transition(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    next: RunStatus,
    change: Change<'_>,
    actor: &Actor,
    reason: Option<&str>,
) -> Result<RunRecord> {
    let current = lock(conn, scope, run_id).await?;
    transition_locked(conn, scope, &current, next, change, actor, reason).await
}

/// [`transition`] of a run the caller has locked in this transaction (as `current`).
pub(crate) async fn transition_locked(
    conn: &mut PgConnection,
    scope: &Scope,
    current: &RunRecord,
    next: RunStatus,
    change: Change<'_>,
    actor: &Actor,
    reason: Option<&str>,
) -> Result<RunRecord> {
    let moved = Move {
        next,
        change,
        actor,
        reason,
    };
    transition_recorded(conn, scope, current, moved, &[]).await
}

/// A run's move to another status, as [`transition`] takes it.
pub(crate) struct Move<'a> {
    pub(crate) next: RunStatus,
    pub(crate) change: Change<'a>,
    pub(crate) actor: &'a Actor,
    pub(crate) reason: Option<&'a str>,
}

/// [`transition_locked`] that also appends `events` (`events::append`'s function) in the
/// same statement, after the change: for the transaction's last write, so that its events
/// cost no round trip of their own.
pub(crate) async fn transition_recorded(
    conn: &mut PgConnection,
    scope: &Scope,
    current: &RunRecord,
    moved: Move<'_>,
    events: &[NewEvent<'_>],
) -> Result<RunRecord> {
    transition_if(conn, scope, current, moved, events, None)
        .await?
        .ok_or(StoreError::NotFound("run"))
}

/// [`transition_recorded`] of a run read but not locked (`current` as it was read), in a
/// statement of its own that first locks the job row, fenced by `lease` (the order every
/// transaction of a job takes them in): None, and nothing changed, when the run is no
/// longer as read or the lease is lost.
pub(crate) async fn transition_fenced(
    conn: &mut PgConnection,
    lease: &Lease,
    current: &RunRecord,
    moved: Move<'_>,
    events: &[NewEvent<'_>],
) -> Result<Option<RunRecord>> {
    transition_if(conn, &lease.scope(), current, moved, events, Some(lease)).await
}

/// The one transition statement: the run moves only from `current`'s status, and, with a
/// lease, only while the lease holds.
async fn transition_if(
    conn: &mut PgConnection,
    scope: &Scope,
    current: &RunRecord,
    moved: Move<'_>,
    events: &[NewEvent<'_>],
    lease: Option<&Lease>,
) -> Result<Option<RunRecord>> {
    let Move {
        next,
        change,
        actor,
        reason,
    } = moved;
    ensure_can_become(current, next)?;
    let batch = events::Batch::of(events);
    // One statement: the change, its audit rows (the task's only while this run is its
    // latest, whose status the task's projects) and the events, appended once the change
    // is made (`appended` reads `updated`) and not at all when there are none.
    let run = query_runs!(
        r#"WITH updated AS (
             UPDATE runs SET
                status = $2,
                attempt = attempt + CASE WHEN $2 = 'running' THEN 1 ELSE 0 END,
                worker_id = CASE WHEN $2 = 'running' THEN $3 ELSE worker_id END,
                started_at = CASE WHEN $2 = 'running' THEN now() ELSE started_at END,
                finished_at = CASE WHEN $2 IN ('completed', 'failed', 'cancelled') THEN now() END,
                exit_code = COALESCE($4, exit_code),
                last_error = COALESCE($5, last_error),
                answer = COALESCE($20, answer),
                terminal_code = $21,
                updated_at = now()
             WHERE workspace_id = $6 AND id = $1 AND status = $7
               AND ($17::bigint IS NULL OR fence_job($17, $18, $19))
             RETURNING *
         ), audit AS (
             INSERT INTO state_transitions (workspace_id, entity_type, entity_id, task_id,
                                            from_status, to_status, reason, actor)
             SELECT $6, e.entity_type, e.entity_id, r.task_id, $7, r.status, $8, $9
             FROM updated r
             CROSS JOIN LATERAL (VALUES ('run', r.id), ('task', r.task_id))
                 AS e(entity_type, entity_id)
             WHERE e.entity_type = 'run'
                OR ($7 IS DISTINCT FROM r.status
                    AND EXISTS (SELECT 1 FROM tasks t WHERE t.workspace_id = $6
                                AND t.id = r.task_id AND t.latest_run_id = r.id))
         ), appended AS (
             SELECT append_events($10, $11, $12, $13, $14, $15, $16, $6) AS count
             FROM updated WHERE cardinality($15::text[]) > 0
         )
         "#,
        // Counting the calls' results makes them happen.
        "FROM updated WHERE (SELECT count(appended.count) FROM appended) >= 0",
        current.id,
        next.as_str(),
        change.worker_id,
        change.exit_code,
        change.last_error,
        scope.workspace(),
        current.status.as_str(),
        reason,
        actor.to_string(),
        events::Batch::LOCK_CLASS,
        &batch.event_ids,
        &batch.task_ids as &[Option<&str>],
        &batch.run_ids as &[Option<&str>],
        &batch.media_job_ids as &[Option<&str>],
        &batch.types as &[&str],
        &batch.data as &[serde_json::Value],
        lease.map(|l| l.job_id),
        lease.map(|l| l.fencing_token),
        lease.map(|l| l.owner.as_str()),
        change.answer,
        TerminalCode::of(next, change.last_error.or(current.last_error.as_deref()))
            .map(TerminalCode::as_str),
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(run)
}

/// The transition statement only checks that the run is still as read: whether the state
/// machine allows the move from there is checked here, before it.
fn ensure_can_become(current: &RunRecord, next: RunStatus) -> Result<()> {
    if !current.status().can_become(next) {
        let id = &current.id;
        return Err(StoreError::ConflictNext {
            message: format!(
                "run {id} is {}; it cannot become {}",
                current.status,
                next.as_str()
            ),
            next: format!("Read the run as it is now (keel runs show {id})."),
        });
    }
    Ok(())
}

/// Cancels a run at a caller's request; see [`cancel_because`].
pub async fn cancel(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    run_id: &str,
    actor: &Actor,
) -> Result<RunRecord> {
    cancel_because(conn, scope, task_id, run_id, actor, "cancelled by request").await
}

/// Cancels a run: the terminal state is committed first; the worker holding the job sees
/// its job row vanish and stops the process. Pending approvals are cancelled by the
/// system. Cancelling a finished run returns it unchanged. `reason` becomes the run's
/// `last_error` and the transition's reason.
pub(crate) async fn cancel_because(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    run_id: &str,
    actor: &Actor,
    reason: &str,
) -> Result<RunRecord> {
    get(conn, scope, task_id, run_id).await?;
    // The job row is locked (deleted) before the run row, the order every worker
    // transaction takes them in, so a cancel and a worker write cannot deadlock.
    queue::remove(
        conn,
        scope,
        JobKind::Run.as_str(),
        run_id,
        queue::Locked::Wait,
    )
    .await?;
    let run = lock(conn, scope, run_id).await?;
    if run.status().is_terminal() {
        return Ok(run);
    }
    let change = Change {
        last_error: Some(reason),
        ..Change::default()
    };
    let cancelled = RunStatus::Cancelled;
    let run = transition(conn, scope, run_id, cancelled, change, actor, Some(reason)).await?;
    approvals::cancel_pending(conn, scope, run_id, "the run was cancelled").await?;
    close_open_work(conn, scope, run_id, "cancelled", "run cancelled").await?;
    // An approval that won the race for the run lock may have enqueued it since the first
    // removal. A worker that already claimed that job waits on the run row and will find
    // the run cancelled, so its locked row is skipped rather than waited for.
    queue::remove(
        conn,
        scope,
        JobKind::Run.as_str(),
        run_id,
        queue::Locked::Skip,
    )
    .await?;
    let data = serde_json::json!({ "actor": actor.to_string() });
    events::append(
        conn,
        scope,
        &[NewEvent::new(task_id, run_id, EventType::RunCancelled).with(data)],
    )
    .await?;
    Ok(run)
}

/// Ends the steps and artifacts an interrupted attempt left open.
pub(crate) async fn close_open_work(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    step_status: &str,
    reason: &str,
) -> Result<()> {
    sqlx::query!(
        "UPDATE steps SET status = $2, error = $3, finished_at = now()
         WHERE workspace_id = $4 AND run_id = $1 AND status = 'running'",
        run_id,
        step_status,
        reason,
        scope.workspace(),
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        "UPDATE artifacts SET status = 'complete', updated_at = now()
         WHERE workspace_id = $2 AND run_id = $1 AND status = 'writing'",
        run_id,
        scope.workspace(),
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Requeues a run whose worker is gone, in the caller's transaction that locked it: closes
/// what the attempt left open, records the gap, and puts the run back to `queued`; returns
/// the queued run and its events, for the caller to append last (see store::events).
pub(crate) async fn requeue_lost<'r>(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &'r RunRecord,
    reason: &str,
    actor: &Actor,
) -> Result<(RunRecord, Vec<NewEvent<'r>>)> {
    close_open_work(conn, scope, &run.id, "failed", "worker disconnected").await?;
    let queued = transition_locked(
        conn,
        scope,
        run,
        RunStatus::Queued,
        Change::default(),
        actor,
        Some(reason),
    )
    .await?;
    let gap = serde_json::json!({
        "reason": reason,
        "previous_worker_id": run.worker_id,
        "attempt": run.attempt,
    });
    let events = vec![
        NewEvent::new(&run.task_id, &run.id, EventType::GapRunDisconnected).with(gap),
        NewEvent::new(&run.task_id, &run.id, EventType::RunQueued)
            .with(serde_json::json!({ "reason": reason })),
    ];
    Ok((queued, events))
}

/// A `queued` or `running` run, as boot recovery pages through them.
#[derive(Debug)]
pub(crate) struct ActiveRun {
    pub(crate) run_id: String,
    pub(crate) priority: i32,
    pub(crate) workspace_id: String,
}

/// Up to `limit` active runs after `after` in id order, in every workspace (boot recovery
/// re-enqueues those that lost their queue row), but for client-orchestrated runs: their
/// client holds them, never a worker.
pub(crate) async fn active_page(
    conn: &mut PgConnection,
    after: &str,
    limit: i64,
) -> Result<Vec<ActiveRun>> {
    let page = sqlx::query_as!(
        ActiveRun,
        "SELECT r.id AS run_id, t.priority, r.workspace_id
         FROM runs r JOIN tasks t ON t.id = r.task_id
         WHERE r.status IN ('queued', 'running') AND r.id > $1
           AND NOT EXISTS (SELECT 1 FROM client_leases c WHERE c.run_id = r.id)
         ORDER BY r.id LIMIT $2",
        after,
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(page)
}
