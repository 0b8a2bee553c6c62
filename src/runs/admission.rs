//! How a run comes to be: the one-active-run guard, the approval gates and what the
//! approver sees, lineage (retries, resumes, forks), the budget and idempotency, and the one
//! statement that writes the run, its job and its events.

use keel_api_types::ErrorCode;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use crate::approvals;
use crate::approvals::{ActionSummary, ApprovalKind, ApprovalPolicy, InForce, Policies, Runs};
use crate::attempt::JobKind;
use crate::db::{Result, StoreError, violates};
use crate::domain::{Actor, EventType, Role, RunStatus, Scope, new_id};
use crate::events;
use crate::events::NewEvent;
use crate::queue::Enqueue;
use crate::tasks;
use crate::tasks::Hooks;
use crate::tasks::{RunTimeouts, StdioCommands, WorkspaceRoots};
use crate::tasks::{TaskRecord, TaskRecordExt};
use keel_api_types::{GateDecision, McpServer};
use keel_workers::Execution;

use keel_api_types::RunRecord;

use super::store::{Change, Move, get, transition_recorded};

/// The rules every run-creating path applies, from configuration.
#[derive(Debug, Clone, Default)]
pub struct AdmissionRules {
    pub approvals: ApprovalPolicy,
    /// The workspaces' approval policies this process keeps (shared by every copy).
    pub policies: Arc<Policies>,
    /// How long an approval stays actionable; None: until resolved.
    pub approval_ttl: Option<Duration>,
    /// The default and longest run timeout a task may have.
    pub timeouts: RunTimeouts,
    /// Where `in_place` tasks may work.
    pub workspace_roots: WorkspaceRoots,
    /// The programs a member's task may start as stdio MCP servers.
    pub mcp_stdio_commands: StdioCommands,
    /// Longest a client may hold a client-orchestrated run; None: as long as it appends.
    pub client_lease_max: Option<Duration>,
}

/// Where a new run comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Start,
    /// A fresh attempt at the task, in a fresh workspace.
    Retry(String),
    /// Carries on from a finished run: its workspace, checkpoint and cost.
    Resume(String),
    /// Resumes a finished agent loop run with one more user turn.
    Continue {
        run_id: String,
        prompt: String,
    },
    /// Resumes a finished agent loop run from before its `index`-th (1-based) model call.
    RetryFromModelCall {
        run_id: String,
        index: i32,
    },
}

impl Origin {
    /// The origin as a stable JSON value, for idempotency fingerprints: it must compare
    /// equal across versions, which a `Debug` rendering does not promise.
    pub(crate) fn fingerprint(&self) -> serde_json::Value {
        match self {
            Origin::Start => serde_json::json!({ "kind": "start" }),
            Origin::Retry(run_id) => serde_json::json!({ "kind": "retry", "run_id": run_id }),
            Origin::Resume(run_id) => serde_json::json!({ "kind": "resume", "run_id": run_id }),
            Origin::Continue { run_id, prompt } => {
                serde_json::json!({ "kind": "continue", "run_id": run_id, "prompt": prompt })
            }
            Origin::RetryFromModelCall { run_id, index } => serde_json::json!({
                "kind": "retry_from_model_call", "run_id": run_id, "model_call_index": index
            }),
        }
    }

    /// The source run of a retry or of a lineage origin; None for a start.
    pub(crate) fn source_run(&self) -> Option<&str> {
        match self {
            Origin::Start => None,
            Origin::Retry(id)
            | Origin::Resume(id)
            | Origin::Continue { run_id: id, .. }
            | Origin::RetryFromModelCall { run_id: id, .. } => Some(id),
        }
    }

    /// `runs.lineage_kind` of a run of this origin: how it carries on from its source (in
    /// the source's workspace, with its checkpoint and cost). None for a start or a retry.
    pub(crate) fn lineage_kind(&self) -> Option<&'static str> {
        match self {
            Origin::Start | Origin::Retry(_) => None,
            Origin::Resume(_) => Some("resume"),
            Origin::Continue { .. } => Some("continue"),
            Origin::RetryFromModelCall { .. } => Some("retry_from_model_call"),
        }
    }
}

/// What a run-creating request asks for.
#[derive(Debug, Clone)]
pub struct Admission {
    pub(crate) origin: Origin,
    /// The `Idempotency-Key` header and the request it came with.
    pub(crate) idempotency: Option<(String, serde_json::Value)>,
    pub(crate) reason: Option<String>,
    /// Raises the task's budget; a lower value leaves it as it is.
    pub(crate) budget_micros_usd: Option<i64>,
    /// Set when a schedule occurrence, not a client, asks for the run.
    pub(crate) schedule: Option<ScheduleProvenance>,
    /// The conversation an agent loop run starts from (`runs.conversation_base`), built by
    /// the caller from the source run's `agent_conversation` artifact.
    pub(crate) conversation_base: Option<serde_json::Value>,
    /// Who carries the run out: a worker (queued for one, behind its gates), or its client
    /// ([`crate::runs::client`]: running at once, never queued; Keel executes nothing of it,
    /// so no gate applies).
    pub(crate) orchestrator: Orchestrator,
    /// Who asked for the run (`runs.requested_by`, whom its approvals must not be resolved
    /// by), when that is not the actor admitting it: the writer of the schedule that fires
    /// it, the registrant of the source that imports it. None: the admitting actor.
    pub(crate) requester: Option<Actor>,
}

/// Who carries a run out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Orchestrator {
    #[default]
    Worker,
    Client,
}

/// Which schedule occurrence created a run, and the nominal time it fired for.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ScheduleProvenance {
    pub(crate) schedule_id: String,
    pub(crate) schedule_occurrence_id: String,
    pub(crate) scheduled_for: DateTime<Utc>,
}

impl Admission {
    pub fn new(origin: Origin) -> Self {
        Admission {
            origin,
            idempotency: None,
            reason: None,
            budget_micros_usd: None,
            schedule: None,
            conversation_base: None,
            orchestrator: Orchestrator::Worker,
            requester: None,
        }
    }
}

pub enum Admitted {
    New(RunRecord),
    /// The same idempotency key and request were seen before: the original run.
    Replayed(RunRecord),
}

impl Admitted {
    /// The run, new or replayed.
    pub fn run(&self) -> &RunRecord {
        match self {
            Admitted::New(run) | Admitted::Replayed(run) => run,
        }
    }
}

/// Creates the next run of a task, in the caller's transaction: queued and enqueued, or
/// `awaiting_approval` with its pending approvals when the policy gates it. At most one
/// run per task is active: the task row lock serializes admissions (and deletion), and the
/// partial unique index `runs_one_active_per_task` refuses a second whatever the code does.
pub async fn admit(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    admission: Admission,
    rules: &AdmissionRules,
    actor: &Actor,
) -> Result<Admitted> {
    let task = tasks::get_locked(conn, scope, task_id).await?;
    let hooks = tasks::hooks(conn, scope, task_id).await?;
    admit_locked(conn, scope, (task, hooks), admission, rules, actor).await
}

/// [`admit`] for a task the caller holds locked, with its workflow hooks (None but for
/// an imported task): one it created in this transaction, for example.
pub(crate) async fn admit_locked(
    conn: &mut PgConnection,
    scope: &Scope,
    (task, hooks): (TaskRecord, Option<Hooks>),
    admission: Admission,
    rules: &AdmissionRules,
    actor: &Actor,
) -> Result<Admitted> {
    let task_id = task.id.clone();
    let task_id = task_id.as_str();
    if let Some((key, request)) = &admission.idempotency
        && let Some((run, seen)) = find_by_idempotency_key(conn, scope, task_id, key).await?
    {
        if &seen != request {
            return Err(StoreError::ConflictNext {
                message: format!(
                    "Idempotency-Key '{key}' was already used with a different request"
                ),
                next: "Send this request with a new Idempotency-Key, or send the first \
                       request's body again to get its run back."
                    .into(),
            });
        }
        return Ok(Admitted::Replayed(run));
    }
    let source = match admission.origin.source_run() {
        None => None,
        Some(id) => Some(get(conn, scope, task_id, id).await?),
    };
    let carries_on = admission.origin.lineage_kind().is_some();
    if let (true, Some(source)) = (carries_on, &source)
        && !source.status().is_terminal()
    {
        let id = &source.id;
        return Err(StoreError::ConflictNext {
            message: format!(
                "run {id} is {}; only a finished run can be resumed, continued or retried \
                 from a model call",
                source.status
            ),
            next: format!(
                "Wait for run {id} to end (keel runs watch {id}) or cancel it (keel runs \
                 cancel {id}), then try again."
            ),
        });
    }
    if let (true, Some(source)) = (carries_on, &source)
        && workspace_removed(conn, scope, source.workspace_owner()).await?
    {
        return Err(StoreError::Refused {
            code: ErrorCode::WorkspaceExpired,
            message: format!(
                "run {}'s workspace was removed when its retention ended \
                 (KEEL_WORKSPACE_RETENTION_MS); retry or start the task instead",
                source.id
            ),
        });
    }
    // Only the latest run can be active: admission creates a run only when none is.
    if let (true, Some(active)) = (task.status.is_active(), &task.latest_run_id) {
        return Err(StoreError::ConflictNext {
            message: format!("task {task_id} already has an active run ({active})"),
            next: format!(
                "A task runs once at a time: wait for run {active} to end (keel runs watch \
                 {active}) or cancel it (keel runs cancel {active}), then start the task again."
            ),
        });
    }
    let task = raise_budget(conn, scope, task, admission.budget_micros_usd).await?;
    let lineage = Lineage::of(conn, scope, &admission, source.as_ref()).await?;
    let run_id = new_id("run");
    let new_run = NewRun {
        id: &run_id,
        task: &task,
        admission: &admission,
        lineage: &lineage,
        // A client's run starts at once; a worker's run is decided by its gates below.
        status: RunStatus::Queued,
        decided_by: None,
    };
    if admission.orchestrator == Orchestrator::Client {
        return Ok(Admitted::New(
            started_for_client(conn, scope, &new_run, actor).await?,
        ));
    }
    refuse_unlisted_commands(conn, scope, &task, &rules.mcp_stdio_commands).await?;
    let gated = (hooks.as_ref(), rules, actor);
    Ok(Admitted::New(decided(conn, scope, new_run, gated).await?))
}

/// A client-orchestrated run: written and running at once, held by its client.
async fn started_for_client(
    conn: &mut PgConnection,
    scope: &Scope,
    new_run: &NewRun<'_>,
    actor: &Actor,
) -> Result<RunRecord> {
    let run = insert(conn, scope, new_run, actor, None, &[]).await?;
    let mut appended = created_events(new_run, actor);
    let data = serde_json::json!({ "orchestrator": "client", "attempt": run.attempt + 1 });
    let (task_id, run_id) = (new_run.task.id.as_str(), new_run.id);
    appended.push(NewEvent::new(task_id, run_id, EventType::RunStarted).with(data));
    let moved = Move {
        next: RunStatus::Running,
        change: Change::default(),
        actor,
        reason: Some("held by its client"),
    };
    transition_recorded(conn, scope, &run, moved, &appended).await
}

/// A worker's run, written as the approval policy in force decides its gates: queued, or
/// awaiting its approvals.
async fn decided(
    conn: &mut PgConnection,
    scope: &Scope,
    new_run: NewRun<'_>,
    (hooks, rules, actor): (Option<&Hooks>, &AdmissionRules, &Actor),
) -> Result<RunRecord> {
    let task = new_run.task;
    // Decided by the policy in force as this process keeps it; the run's statement checks
    // that it still is. A policy changed since, or a refusal by a kept one, is read again
    // and decides anew.
    let mut fresh = false;
    for _ in 0..POLICY_READS {
        let policies = &rules.policies;
        let policy = match fresh {
            true => policies.read(conn, scope, &rules.approvals).await?,
            false => policies.in_force(conn, scope, &rules.approvals).await?,
        };
        let (gates, summary) = match gates(conn, scope, task, hooks, &policy.policy).await {
            Err(StoreError::Forbidden(_)) if !fresh => {
                fresh = true;
                continue;
            }
            decided => decided?,
        };
        let decided = NewRun {
            status: match gates.is_empty() {
                true => RunStatus::Queued,
                false => RunStatus::AwaitingApproval,
            },
            decided_by: Some(&policy),
            ..new_run
        };
        if let Some(run) =
            admit_decided(conn, scope, &decided, (gates, summary), rules, actor).await?
        {
            return Ok(run);
        }
        fresh = true;
    }
    Err(StoreError::Conflict(
        "the workspace's approval policy kept changing during the admission; try again".into(),
    ))
}

/// How many times an admission reads the approval policy in force before it gives up: a
/// change between the read and the run's statement makes it read again.
const POLICY_READS: usize = 3;

/// `run.created` (and a resumed run's `run.resumed_from_event`). The task is locked: its
/// next run's number is known before the run is written.
fn created_events<'a>(run: &NewRun<'a>, actor: &Actor) -> Vec<NewEvent<'a>> {
    let (task_id, admission, lineage) = (run.task.id.as_str(), run.admission, run.lineage);
    let created = serde_json::json!({
        "actor": actor.to_string(),
        "number": run.task.run_count + 1,
        "retried_from_run_id": lineage.retried_from,
        "resumed_from_run_id": lineage.resumed.map(|s| &s.id),
        "reason": admission.reason,
        "schedule": admission.schedule,
    });
    let mut events = vec![NewEvent::new(task_id, run.id, EventType::RunCreated).with(created)];
    if let Some(checkpoint) = &lineage.checkpoint {
        let data = serde_json::json!({ "checkpoint": checkpoint, "reason": admission.reason });
        events.push(NewEvent::new(task_id, run.id, EventType::RunResumedFromEvent).with(data));
    }
    events
}

/// Writes a run its gates decided: queued, with its job (the usual case: one statement
/// for the run, its job and its events), or awaiting its approvals. None when the policy
/// that decided is no longer the one in force (nothing was written).
async fn admit_decided(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &NewRun<'_>,
    (gates, summary): (Vec<ApprovalKind>, Option<ActionSummary>),
    rules: &AdmissionRules,
    actor: &Actor,
) -> Result<Option<RunRecord>> {
    let mut appended = created_events(run, actor);
    // A summary exactly when there are gates.
    let Some(summary) = summary else {
        appended.push(NewEvent::new(&run.task.id, run.id, EventType::RunQueued));
        let job = Enqueue::new(JobKind::Run.as_str(), run.id, run.task.priority);
        return insert_decided(conn, scope, run, actor, Some(&job), &appended).await;
    };
    let Some(inserted) = insert_decided(conn, scope, run, actor, None, &[]).await? else {
        return Ok(None);
    };
    let mut gated = Vec::new();
    for kind in gates {
        let gate = approvals::Gate {
            kind,
            step_id: None,
        };
        let ttl = rules.approval_ttl;
        gated.push(approvals::create(conn, scope, &inserted, gate, &summary, ttl, actor).await?);
    }
    appended.extend(gated.iter().map(approvals::requested_event));
    events::append(conn, scope, &appended).await?;
    Ok(Some(inserted))
}

/// Refuses the run of a task naming a stdio MCP server whose program its writer may no
/// longer name: `KEEL_MCP_STDIO_COMMANDS` may have narrowed since a member wrote it. The
/// writer is read only when a command is not listed.
async fn refuse_unlisted_commands(
    conn: &mut PgConnection,
    scope: &Scope,
    task: &TaskRecord,
    commands: &StdioCommands,
) -> Result<()> {
    let servers = mcp_servers(task);
    if commands.check(servers, Role::Member).is_ok() {
        return Ok(());
    }
    let writer = tasks::written_by(conn, scope, &task.id).await?;
    commands
        .check(servers, writer)
        .map_err(StoreError::Forbidden)
}

/// The task's MCP servers (an agent loop's; none for another kind).
fn mcp_servers(task: &TaskRecord) -> &[McpServer] {
    task.mcp_servers
        .as_ref()
        .map_or(&[], |servers| servers.0.as_slice())
}

/// The gates a new run of `task` waits on, and what its approver then sees. An agent
/// loop's tool calls are gated mid-loop, not here, but the stdio MCP servers it starts are
/// programs the task names: they need the approval a shell command needs (and their own,
/// [`ApprovalPolicy::gates_for_mcp_servers`]). An imported task's workflow hooks are shell
/// scripts its worker runs in the workspace: they need the approval a shell command needs.
/// The summary shows each of them.
async fn gates(
    conn: &mut PgConnection,
    scope: &Scope,
    task: &TaskRecord,
    hooks: Option<&Hooks>,
    approvals: &ApprovalPolicy,
) -> Result<(Vec<ApprovalKind>, Option<ActionSummary>)> {
    let execution = if task.is_agent_loop() {
        tasks::chat_routes(conn, scope, task).await?;
        None
    } else {
        Some(task.execution().map_err(StoreError::Conflict)?)
    };
    let servers = mcp_servers(task);
    let sandbox = task.sandbox(scope.workspace());
    let mut gates = match &execution {
        Some(execution) => approvals.gates_for(execution, &sandbox),
        None => approvals.gates_for_mcp_servers(servers, &sandbox),
    };
    let hooks = hooks.filter(|hooks| hooks.any());
    let push = task.repo.as_deref().zip(task.push_branch.as_deref());
    let around = [
        (hooks.is_some(), approvals.gates_for_hooks(&sandbox)),
        (
            task.repo.as_deref().is_some_and(is_remote),
            approvals.gates_for_clone(&sandbox),
        ),
        (push.is_some(), approvals.gates_for_push(&sandbox)),
    ];
    for gate in around
        .into_iter()
        .filter(|(needed, _)| *needed)
        .flat_map(|(_, more)| more)
    {
        if !gates.contains(&gate) {
            gates.push(gate);
        }
    }
    refuse_denied(approvals, &gates, execution.as_ref(), servers)?;
    // In the order an approver reads them: a shell command first.
    gates.sort_by_key(|gate| *gate != ApprovalKind::ShellCommand);
    let workspace = task.workspace_description();
    let runs = match &execution {
        Some(execution) => Runs::Execution(execution),
        None => Runs::AgentLoop(servers),
    };
    let describe = || {
        let summary = ActionSummary::describe(runs, hooks, &workspace, task.timeout_ms);
        match push {
            Some((repo, branch)) => summary.and_push(repo, branch),
            None => summary,
        }
    };
    let summary = (!gates.is_empty()).then(describe);
    Ok((gates, summary))
}

/// How an operator lifts a denial: the command, then the route it calls.
fn operator_may_change(setting: &str) -> String {
    format!(
        "an operator can change it: `keel workspace set-policy WORKSPACE_ID {setting}` \
         (PUT /v1/workspaces/{{workspace_id}}/approval-policy)"
    )
}

/// Refuses a run the workspace's approval policy denies: a gate it needs is `deny`, an MCP
/// server it would start is `deny` by name, or a file task writes outside the policy's
/// write paths.
fn refuse_denied(
    policy: &ApprovalPolicy,
    gates: &[ApprovalKind],
    execution: Option<&Execution>,
    servers: &[McpServer],
) -> Result<()> {
    let denied = gates
        .iter()
        .map(|gate| policy.decision_of(*gate))
        .find(|(decision, _)| *decision == GateDecision::Deny);
    if let Some((_, gate)) = denied {
        return Err(StoreError::Forbidden(format!(
            "the workspace's approval policy denies {gate}; {}",
            operator_may_change(&format!("--gate {gate}=ask"))
        )));
    }
    if let Some(server) = policy.denied_mcp_server(servers) {
        return Err(StoreError::Forbidden(format!(
            "the workspace's approval policy denies the MCP server {server}, which this run \
             would start; {}",
            operator_may_change(&format!("--mcp {server}=ask"))
        )));
    }
    if let Some(Execution::File { path, .. }) = execution
        && !policy.may_write(path)
    {
        let paths = policy.write_paths().unwrap_or_default().join(", ");
        return Err(StoreError::Forbidden(format!(
            "{path}: the workspace's approval policy lets file writers write only beneath: \
             {paths}"
        )));
    }
    Ok(())
}

/// Whether a task's `repo` is reached over the network (a local path or `file://` is not).
fn is_remote(repo: &str) -> bool {
    !(repo.starts_with('/') || repo.starts_with("file://"))
}

/// Where a new run starts from, worked out before its row is written.
struct Lineage<'a> {
    retried_from: Option<&'a str>,
    resumed: Option<&'a RunRecord>,
    checkpoint: Option<serde_json::Value>,
    prior_cost: i64,
    /// The reason its creation gives in the audit trail.
    reason: &'static str,
}

impl<'a> Lineage<'a> {
    async fn of(
        conn: &mut PgConnection,
        scope: &Scope,
        admission: &Admission,
        source: Option<&'a RunRecord>,
    ) -> Result<Lineage<'a>> {
        let lineage_kind = admission.origin.lineage_kind();
        let (retried_from, resumed, checkpoint, prior_cost) = match (&admission.origin, source) {
            (Origin::Retry(_), Some(source)) => (Some(source.id.as_str()), None, None, 0),
            (_, Some(source)) if lineage_kind.is_some() => {
                let checkpoint = checkpoint_of(conn, scope, source).await?;
                let prior = source.prior_cost_micros_usd + source.total_cost_micros_usd;
                (None, Some(source), Some(checkpoint), prior)
            }
            _ => (None, None, None, 0),
        };
        let reason = match (&admission.origin, lineage_kind) {
            (_, Some(kind)) => kind,
            (Origin::Retry(_), None) => "retry",
            _ => "started",
        };
        Ok(Lineage {
            retried_from,
            resumed,
            checkpoint,
            prior_cost,
            reason,
        })
    }
}

/// A run about to be stored.
struct NewRun<'a> {
    id: &'a str,
    task: &'a TaskRecord,
    admission: &'a Admission,
    lineage: &'a Lineage<'a>,
    status: RunStatus,
    /// The approval policy its status was decided by, which must still be in force.
    decided_by: Option<&'a InForce>,
}

/// [`insert_decided`] of a run no approval policy decided.
async fn insert(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &NewRun<'_>,
    actor: &Actor,
    job: Option<&Enqueue<'_>>,
    events: &[NewEvent<'_>],
) -> Result<RunRecord> {
    insert_decided(conn, scope, run, actor, job, events)
        .await?
        .ok_or(StoreError::NotFound("task"))
}

/// Stores the run row, points the task at it (its next number), records both changes in
/// the audit trail, enqueues `job` and appends `events` (after the rest): one statement.
/// None, and nothing written, when the approval policy the run was decided by is no longer
/// the workspace's.
async fn insert_decided(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &NewRun<'_>,
    actor: &Actor,
    job: Option<&Enqueue<'_>>,
    events: &[NewEvent<'_>],
) -> Result<Option<RunRecord>> {
    let NewRun {
        task,
        admission,
        lineage,
        decided_by,
        ..
    } = run;
    let from_model_call_index = match admission.origin {
        Origin::RetryFromModelCall { index, .. } => Some(index),
        _ => None,
    };
    let (key, request) = admission.idempotency.clone().unzip();
    let schedule = admission.schedule.as_ref();
    let batch = events::Batch::of(events);
    // The task's audit row is written only when its projection (its latest run's status)
    // changes, as in `transition`. The job and the events come once the run is written
    // (`enqueued` and `appended` read `inserted`); counting the calls' results makes them
    // happen.
    let inserted = query_runs!(
        r#"WITH counted AS (
             UPDATE tasks SET run_count = run_count + 1, latest_run_id = $1, updated_at = now()
             WHERE workspace_id = $14 AND id = $2
               AND (NOT $33 OR (SELECT p.revision FROM approval_policies p
                                WHERE p.workspace_id = $14) IS NOT DISTINCT FROM $34)
             RETURNING run_count
         ), inserted AS (
             INSERT INTO runs (id, task_id, number, status, retried_from_run_id,
                               resumed_from_run_id, workspace_run_id, checkpoint,
                               prior_cost_micros_usd, idempotency_key, idempotency_request,
                               schedule_id, schedule_occurrence_id, scheduled_for, workspace_id,
                               lineage_kind, from_model_call_index, conversation_base,
                               requested_by)
             SELECT $1, $2, run_count, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                    $18, $19, $20, $35
             FROM counted
             RETURNING *
         ), audit AS (
             INSERT INTO state_transitions (workspace_id, entity_type, entity_id, task_id,
                                            from_status, to_status, reason, actor)
             SELECT $14, e.entity_type, e.entity_id, r.task_id, e.from_status, r.status, $16, $17
             FROM inserted r
             CROSS JOIN LATERAL (VALUES ('run', r.id, NULL), ('task', r.task_id, $15::text))
                 AS e(entity_type, entity_id, from_status)
             WHERE e.entity_type = 'run' OR $15::text IS DISTINCT FROM r.status
         ), enqueued AS (
             SELECT e.inserted
             FROM inserted r, enqueue_job($21, r.id, $22, $23, $14, $24, $25) e
             WHERE $21::text IS NOT NULL
         ), appended AS (
             SELECT append_events($26, $27, $28, $29, $30, $31, $32, $14) AS count
             FROM inserted WHERE cardinality($31::text[]) > 0
         )
         "#,
        "FROM inserted
         WHERE (SELECT count(enqueued.inserted) FROM enqueued) >= 0
           AND (SELECT count(appended.count) FROM appended) >= 0",
        run.id,
        task.id,
        run.status.as_str(),
        lineage.retried_from,
        lineage.resumed.map(|s| &s.id),
        lineage.resumed.map(|s| s.workspace_owner()),
        lineage.checkpoint.as_ref(),
        lineage.prior_cost,
        key,
        request,
        schedule.map(|s| &s.schedule_id),
        schedule.map(|s| &s.schedule_occurrence_id),
        schedule.map(|s| s.scheduled_for),
        scope.workspace(),
        task.status.as_str(),
        lineage.reason,
        actor.to_string(),
        admission.origin.lineage_kind(),
        from_model_call_index,
        admission.conversation_base.as_ref(),
        job.map(|j| j.kind),
        job.map(|j| j.priority),
        job.and_then(|j| j.traceparent.as_deref()),
        Enqueue::CHANNEL,
        Enqueue::LOOKBEHIND,
        events::Batch::LOCK_CLASS,
        &batch.event_ids,
        &batch.task_ids as &[Option<&str>],
        &batch.run_ids as &[Option<&str>],
        &batch.media_job_ids as &[Option<&str>],
        &batch.types as &[&str],
        &batch.data as &[serde_json::Value],
        decided_by.is_some(),
        decided_by.and_then(|policy| policy.revision),
        admission.requester.as_ref().unwrap_or(actor).to_string(),
    )
    .fetch_optional(&mut *conn)
    .await;
    match inserted {
        Err(e) if violates(&e, "runs_one_active_per_task") => Err(StoreError::ConflictNext {
            message: format!("task {} already has an active run", task.id),
            next: format!(
                "Another start of the task won: see its run (keel runs list {}); a task runs \
                 once at a time.",
                task.id
            ),
        }),
        other => Ok(other?),
    }
}

/// Where a resumed run picks up: the source run, its last completed step and last event.
async fn checkpoint_of(
    conn: &mut PgConnection,
    scope: &Scope,
    source: &RunRecord,
) -> Result<serde_json::Value> {
    let step = sqlx::query!(
        "SELECT index, name FROM steps
         WHERE workspace_id = $1 AND run_id = $2 AND status = 'completed'
         ORDER BY index DESC LIMIT 1",
        scope.workspace(),
        source.id,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let last_sequence = events::last_sequence_of_run(conn, scope, &source.id).await?;
    let step = step.map(|s| serde_json::json!({ "index": s.index, "name": s.name }));
    Ok(serde_json::json!({
        "source_run_id": source.id,
        "last_completed_step": step,
        "last_event_sequence": last_sequence,
    }))
}

/// Preserves or raises the task's budget, never lowers it; returns the task as it is now.
async fn raise_budget(
    conn: &mut PgConnection,
    scope: &Scope,
    mut task: TaskRecord,
    budget: Option<i64>,
) -> Result<TaskRecord> {
    if let Some(budget) = budget.filter(|b| *b > task.budget_micros_usd) {
        sqlx::query!(
            "UPDATE tasks SET budget_micros_usd = $2 WHERE workspace_id = $3 AND id = $1",
            task.id,
            budget,
            scope.workspace(),
        )
        .execute(&mut *conn)
        .await?;
        task.budget_micros_usd = budget;
    }
    Ok(task)
}

async fn find_by_idempotency_key(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    key: &str,
) -> Result<Option<(RunRecord, serde_json::Value)>> {
    let seen = sqlx::query!(
        r#"SELECT id, task_id, number, status AS "status: RunStatus", attempt, worker_id,
                  exit_code, last_error, retried_from_run_id, resumed_from_run_id, checkpoint,
                  prior_cost_micros_usd, total_cost_micros_usd, model_call_count,
                  abandoned_model_calls, model, provider, workspace_run_id, schedule_id,
                  schedule_occurrence_id, scheduled_for, created_at, started_at, finished_at,
                  updated_at, lineage_kind, from_model_call_index, conversation_base,
                  requested_by, answer,
                  terminal_code AS "terminal_code: keel_api_types::TerminalCode", idempotency_request AS "idempotency_request!"
           FROM runs WHERE workspace_id = $3 AND task_id = $1 AND idempotency_key = $2"#,
        task_id,
        key,
        scope.workspace(),
    )
    .fetch_optional(conn)
    .await?;
    Ok(seen.map(|row| (run_record!(row), row.idempotency_request)))
}

/// Whether the retention sweep removed the ephemeral workspace of run `owner`. Read under
/// the task's lock, which the sweep also takes: a resume admitted first keeps the
/// workspace (its run is active), one admitted after sees it gone.
async fn workspace_removed(conn: &mut PgConnection, scope: &Scope, owner: &str) -> Result<bool> {
    let removed = sqlx::query_scalar!(
        r#"SELECT workspace_removed_at IS NOT NULL AS "removed!"
           FROM runs WHERE workspace_id = $1 AND id = $2"#,
        scope.workspace(),
        owner,
    )
    .fetch_optional(conn)
    .await?;
    Ok(removed.unwrap_or(false))
}
