//! The `run` job: drives one run through an executor. Every write it makes on the run's
//! behalf happens in a transaction fenced by the job's lease, so a worker that lost its
//! lease (paused, partitioned, presumed dead) cannot change the run afterwards.
//!
//! An attempt whose process writes no output is two transactions: the start (the run
//! `running`, `run.started`) and the end (its step and output artifacts, the run's
//! terminal state and events, the ack). The executor's step and artifact rows are held
//! back ([`FencedContext`]) and written with the next durable write (output bytes, the
//! end), or after [`HOLD_LIMIT`], so a long process's step shows up while it runs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use futures_util::future::BoxFuture;
use keel_workers::agent::provider::ChatLimits;
use keel_workers::hooks::HookRun;
use keel_workers::{
    ArtifactHandle, ContextError, Outcome, OutputStream, RunContext, RunSpec, StepHandle,
    StepResult,
};
use sqlx::{PgConnection, PgPool};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::agent;
use crate::agent::prices::PriceTable;
use crate::approvals;
use crate::approvals::Gate;
use crate::approvals::{ActionSummary, ApprovalKind, ApprovalPolicy};
use crate::artifacts;
use crate::artifacts::content::ContentStore;
use crate::artifacts::{NewArtifact, Upserted};
use crate::attempt;
use crate::attempt::fence::{DomainRow, Fence};
use crate::attempt::{Attempted, Verdict};
use crate::db::StoreError;
use crate::domain::{Actor, EventType, RunStatus, Scope, new_id};
use crate::events;
use crate::events::{NewEvent, Subject};
use crate::external::workflow::Hooks;
use crate::providers::ProviderHosts;
use crate::providers::secrets::SecretPolicy;
use crate::queue::worker::{Job, JobHandler};
use crate::queue::{self, Lease};
use crate::runs;
use crate::runs::steps;
use crate::runs::steps::{NewStep, StepRecord};
use crate::runs::{Change, RunRecord, RunWithTask};
use crate::tasks::{RunTimeouts, WorkspaceRoots};
use crate::tasks::{TaskRecord, TaskRecordExt};

pub struct RunJobs {
    pub pool: PgPool,
    /// Ephemeral workspaces live under `<data_dir>/workspaces/<run_id>` (a resumed run
    /// reuses the directory of the run it resumes).
    pub data_dir: PathBuf,
    pub artifact_max_bytes: i64,
    pub content: ContentStore,
    pub timeouts: RunTimeouts,
    /// Checked again before each `in_place` run: the directory or the roots may have
    /// changed since the API accepted the task.
    pub workspace_roots: WorkspaceRoots,
    /// The operator's `KEEL_RUN_ENV_PASSTHROUGH` variables, with this worker's values.
    pub passthrough_env: Vec<(String, String)>,
    /// Agent loops: the tools whose calls wait for an approval, and how long one stays
    /// actionable.
    pub approvals: ApprovalPolicy,
    pub approval_ttl: Option<Duration>,
    /// Agent loops: the cost of each model call (`KEEL_MODEL_PRICES`).
    pub prices: PriceTable,
    /// Agent loops: which secret references a chat preset's API key may use.
    pub secrets: SecretPolicy,
    /// Agent loops: which hosts a member's chat preset may still call.
    pub provider_hosts: ProviderHosts,
    /// Agent loops: how model calls are made (`KEEL_CHAT_*`); its private-address switch
    /// also lets `http_request` reach private addresses.
    pub chat: ChatLimits,
}

/// The longest a step or artifact row is held back before it is written on its own.
const HOLD_LIMIT: Duration = Duration::from_millis(200);

/// Where a worker keeps its runs' ephemeral workspaces, one directory per run id.
pub fn ephemeral_root(data_dir: &Path) -> PathBuf {
    data_dir.join("workspaces")
}

/// The directory a run works in: its task's `in_place` directory, re-confined to the
/// workspace roots, or its ephemeral `<data_dir>/workspaces/<workspace owner>` (which may
/// not exist yet). Workers run there; the patches API reverts files there.
pub fn workspace_dir(
    roots: &WorkspaceRoots,
    data_dir: &Path,
    task: &TaskRecord,
    run: &RunRecord,
) -> Result<PathBuf, String> {
    match &task.working_directory {
        Some(directory) if task.workspace_mode == "in_place" => roots
            .confine(directory, task.sandbox_allowed_root.as_deref())
            .map_err(|e| format!("workspace_refused: {}: {}", e.field, e.message)),
        _ => Ok(ephemeral_root(data_dir).join(run.workspace_owner())),
    }
}

impl JobHandler for RunJobs {
    fn kind(&self) -> &'static str {
        queue::RUN_KIND
    }

    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()> {
        let span = tracing::info_span!(
            "run_job",
            run_id = %job.lease.ref_id,
            attempt = job.lease.attempts,
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let ref_id = job.lease.ref_id.clone();
        crate::attempt::observe(queue::RUN_KIND, ref_id, span, async move {
            self.execute(job).await
        })
    }
}

impl DomainRow for RunWithTask {
    fn lock(
        conn: &mut PgConnection,
        scope: &Scope,
        id: &str,
    ) -> impl Future<Output = Result<Self, StoreError>> + Send {
        runs::lock_with_task(conn, scope, id)
    }

    fn has_ended(&self) -> bool {
        self.run.status().is_terminal()
    }
}

/// How an attempt that ran to its end leaves the run, with the rows its context still
/// held (written in the same transaction).
pub struct RunEnding {
    held: Held,
    written: Written,
    /// An agent loop's conversation, written as its `agent_conversation` artifact.
    conversation: Option<agent::Conversation>,
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

    pub(crate) fn with_conversation(
        mut self,
        conversation: Option<agent::Conversation>,
    ) -> RunEnding {
        self.conversation = conversation;
        self
    }
}

impl Attempted for RunWithTask {
    type Ending = RunEnding;
    /// The runtime's error.
    type Retry = String;

    fn is_running(&self) -> bool {
        self.run.status() == RunStatus::Running
    }

    fn gave_up(error: String, _: Option<&String>) -> RunEnding {
        let failed = End::Failed {
            exit_code: None,
            error,
        };
        RunEnding::new(Held::default(), failed)
    }

    fn label(ending: &RunEnding) -> &'static str {
        match ending.end {
            End::Completed { .. } => "completed",
            End::Failed { .. } => "failed",
            End::AwaitingApproval { .. } => "awaiting_approval",
        }
    }

    fn retry_error(retry: &String) -> &str {
        retry
    }

    fn retry_delay(_: &String) -> Option<Duration> {
        None
    }

    async fn requeue_lost<'r>(
        &'r self,
        conn: &mut PgConnection,
        scope: &Scope,
        reason: &'static str,
        actor: &Actor,
    ) -> Result<(Self, Vec<NewEvent<'r>>), StoreError> {
        let (run, events) = runs::requeue_lost(conn, scope, &self.run, reason, actor).await?;
        let (task, hooks) = (self.task.clone(), self.hooks.clone());
        Ok((RunWithTask { run, task, hooks }, events))
    }

    async fn start<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
    ) -> Result<(Self, NewEvent<'r>), StoreError> {
        let change = Change {
            worker_id: Some(&lease.owner),
            ..Change::default()
        };
        let (scope, actor) = (lease.scope(), attempt::worker(lease));
        let current = &self.run;
        let (running, claimed) = (RunStatus::Running, Some("claimed"));
        let run = runs::transition_locked(conn, &scope, current, running, change, &actor, claimed)
            .await?;
        let data = serde_json::json!({ "attempt": run.attempt, "worker_id": lease.owner });
        let event = NewEvent::new(&current.task_id, &current.id, EventType::RunStarted).with(data);
        let (task, hooks) = (self.task.clone(), self.hooks.clone());
        Ok((RunWithTask { run, task, hooks }, event))
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
            let written = agent::write_conversation(conn, &scope, owner, conversation).await?;
            events.extend(artifacts::created_event(owner, &written));
        }
        let (status, change, reason, event) = match &ending.end {
            End::Completed { exit_code } => {
                let change = Change {
                    exit_code: *exit_code,
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
                let actor = attempt::worker(lease);
                let (waiting, reason) = (RunStatus::AwaitingApproval, "tool calls need approval");
                let change = Change::default();
                let run = runs::transition_locked(
                    conn,
                    &scope,
                    run,
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
                let approval =
                    approvals::create(conn, &scope, &run, gate, summary, *ttl, &actor).await?;
                let data = approvals::requested_data(&approval);
                events.push(
                    NewEvent::new(
                        &self.run.task_id,
                        &self.run.id,
                        EventType::ApprovalRequested,
                    )
                    .with(data),
                );
                return Ok(events);
            }
        };
        let actor = attempt::worker(lease);
        runs::transition_locked(conn, &scope, run, status, change, &actor, Some(reason)).await?;
        events.push(event);
        Ok(events)
    }

    async fn requeue<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        error: &'r String,
        _: Duration,
    ) -> Result<NewEvent<'r>, StoreError> {
        let (scope, run) = (lease.scope(), &self.run);
        let (queued, actor) = (RunStatus::Queued, attempt::worker(lease));
        let change = Change::default();
        runs::transition_locked(conn, &scope, run, queued, change, &actor, Some(error)).await?;
        runs::close_open_work(conn, &scope, &run.id, "failed", error).await?;
        let data = serde_json::json!({ "reason": "retry", "error": error });
        Ok(NewEvent::new(&run.task_id, &run.id, EventType::RunQueued).with(data))
    }
}

impl RunJobs {
    /// Runs one attempt; returns its outcome, as the job duration metric labels it.
    async fn execute(&self, job: Job) -> Result<&'static str, StoreError> {
        let Some(row) = attempt::begin::<RunWithTask>(&self.pool, &job.lease).await? else {
            return Ok("skipped");
        };
        if row.task.is_agent_loop() {
            return agent::execute(self, job, row).await;
        }
        let spec = match self.spec(&row.task, &row.run).await {
            Ok(spec) => spec,
            Err(error) => return self.fail(&job, &row, error).await,
        };
        let ctx = self.context(&job, &row);
        let outcome = ctx.around(keel_workers::execute(&spec, &ctx)).await;
        let verdict = ctx.verdict(outcome, None).await;
        attempt::conclude(&self.pool, &job, &row, verdict).await
    }

    /// Ends an attempt that could not start its executor.
    pub(crate) async fn fail(
        &self,
        job: &Job,
        row: &RunWithTask,
        error: String,
    ) -> Result<&'static str, StoreError> {
        let failed = End::Failed {
            exit_code: None,
            error,
        };
        let verdict = Verdict::Ended(RunEnding::new(Held::default(), failed));
        attempt::conclude(&self.pool, job, row, verdict).await
    }

    pub(crate) fn context(&self, job: &Job, row: &RunWithTask) -> FencedContext {
        FencedContext {
            shared: Arc::new(Shared {
                fence: Fence::new(&self.pool, job),
                task_id: row.task.id.clone(),
                run_id: row.run.id.clone(),
                artifact_max_bytes: self.artifact_max_bytes,
                content: self.content.clone(),
                held: Mutex::default(),
                hooks: self.hooks(row),
            }),
        }
    }

    /// What an imported task's attempts need to run its workflow hooks; None without any
    /// (or with a workspace the attempt will refuse anyway).
    fn hooks(&self, row: &RunWithTask) -> Option<AttemptHooks> {
        let (task, run) = (&row.task, &row.run);
        let hooks = row.hooks.clone()?;
        let workspace = workspace_dir(&self.workspace_roots, &self.data_dir, task, run).ok()?;
        Some(AttemptHooks {
            hooks,
            workspace,
            env: self.env(task, run),
            sandbox: task.sandbox(),
        })
    }

    async fn spec(&self, task: &TaskRecord, run: &RunRecord) -> Result<RunSpec, String> {
        Ok(RunSpec {
            execution: task.execution()?,
            workspace: self.workspace(task, run).await?,
            sandbox: task.sandbox(),
            timeout: Some(self.timeout(task)),
            env: self.env(task, run),
            checkpoint: run.checkpoint.clone(),
        })
    }

    /// The run's workspace directory, created if it is an ephemeral one.
    pub(crate) async fn workspace(
        &self,
        task: &TaskRecord,
        run: &RunRecord,
    ) -> Result<PathBuf, String> {
        let workspace = workspace_dir(&self.workspace_roots, &self.data_dir, task, run)?;
        tokio::fs::create_dir_all(&workspace).await.map_err(|e| {
            format!(
                "could not create the workspace {}: {e}",
                workspace.display()
            )
        })?;
        Ok(workspace)
    }

    /// Tasks stored before the timeout settings may have none, or a longer one.
    pub(crate) fn timeout(&self, task: &TaskRecord) -> Duration {
        Duration::from_millis(self.timeouts.effective_ms(task.timeout_ms).max(1) as u64)
    }

    /// The variables of the processes a run starts.
    pub(crate) fn env(&self, task: &TaskRecord, run: &RunRecord) -> Vec<(String, String)> {
        vec![
            ("KEEL_TASK_ID".into(), task.id.clone()),
            ("KEEL_RUN_ID".into(), run.id.clone()),
            ("KEEL_RUN_ATTEMPT".into(), run.attempt.to_string()),
        ]
        .into_iter()
        .chain(
            run.resumed_from_run_id
                .iter()
                .map(|id| ("KEEL_RESUMED_FROM_RUN_ID".into(), id.clone())),
        )
        // A task imported from external work carries its rendered prompt.
        .chain(
            task.prompt
                .iter()
                .map(|prompt| ("KEEL_RUN_PROMPT".into(), prompt.clone())),
        )
        .chain(self.passthrough_env.iter().cloned())
        .collect()
    }
}

impl FencedContext {
    /// Runs the attempt `body` between the task's `before_run` and `after_run` hooks
    /// (Symphony's rules), after `after_create` in a workspace not prepared yet ([`prepare`]):
    /// an `after_create` or a `before_run` that fails ends the attempt failed with
    /// `hook_failed:` and `body` never runs; an `after_run` failure is logged and ignored.
    /// Each hook's output is an artifact of the run.
    ///
    /// [`prepare`]: FencedContext::prepare
    pub(crate) async fn around(&self, body: impl Future<Output = Outcome>) -> Outcome {
        let Some(hooks) = &self.shared.hooks else {
            return body.await;
        };
        if let Err(stopped) = self.prepare(hooks).await {
            return stopped;
        }
        if let Some(script) = &hooks.hooks.before_run {
            let ran = match self.run_hook(hooks, "before_run", script).await {
                Ok(ran) => ran,
                Err(stopped) => return stopped,
            };
            if let Some(error) = ran.failure() {
                return Outcome::Failed {
                    exit_code: None,
                    error,
                };
            }
        }
        let outcome = body.await;
        if let (Some(script), false) = (&hooks.hooks.after_run, outcome == Outcome::Interrupted) {
            match self.run_hook(hooks, "after_run", script).await {
                Ok(ran) => {
                    if let Some(failure) = ran.failure() {
                        let run_id = &self.shared.run_id;
                        tracing::warn!(%run_id, %failure, "after_run failed; ignored");
                    }
                }
                Err(stopped) => {
                    let run_id = &self.shared.run_id;
                    tracing::warn!(%run_id, ?stopped, "after_run's output was not recorded");
                }
            }
        }
        outcome
    }

    /// Runs `after_create` in a workspace no attempt prepared yet (a new one, or one whose
    /// preparation was cut short), then marks it prepared: once per workspace, in the
    /// worker, once the run was admitted (approved, where the policy gates it). A failure
    /// ends the attempt and empties the workspace, so the next attempt's `after_create`
    /// starts afresh (Symphony); the directory stays, as the task's `in_place` directory.
    async fn prepare(&self, hooks: &AttemptHooks) -> Result<(), Outcome> {
        let workspace = &hooks.workspace;
        if keel_workers::hooks::is_prepared(workspace) {
            return Ok(());
        }
        if let Some(script) = &hooks.hooks.after_create {
            let ran = self.run_hook(hooks, "after_create", script).await?;
            if let Some(error) = ran.failure() {
                if let Err(failed) = empty(workspace).await {
                    let run_id = &self.shared.run_id;
                    tracing::warn!(%run_id, %failed, "emptying a workspace whose after_create failed");
                }
                return Err(Outcome::Failed {
                    exit_code: None,
                    error,
                });
            }
        }
        keel_workers::hooks::mark_prepared(workspace)
            .await
            .map_err(|error| Outcome::Failed {
                exit_code: None,
                error: format!("workspace_unavailable: {error}"),
            })
    }

    /// Runs one hook and records its output; Err: how the attempt stops instead (it was
    /// interrupted, or the output could not be written).
    async fn run_hook(
        &self,
        hooks: &AttemptHooks,
        hook: &str,
        script: &str,
    ) -> Result<HookRun, Outcome> {
        let timeout = hooks.hooks.timeout();
        let (workspace, env, cancel) = (&hooks.workspace, &hooks.env, self.cancellation());
        let ran =
            keel_workers::hooks::run(hook, script, workspace, env, hooks.sandbox, timeout, cancel)
                .await
                .ok_or(Outcome::Interrupted)?;
        self.shared.record_hook(&ran).await.map_err(|e| match e {
            ContextError::Interrupted => Outcome::Interrupted,
            ContextError::Runtime(error) => Outcome::Retry { error },
        })?;
        Ok(ran)
    }

    /// How the attempt leaves the run, with the rows the context still holds (and for an
    /// agent loop, its conversation and the step an approval would cover).
    pub(crate) async fn verdict(
        &self,
        outcome: Outcome,
        agent: Option<agent::AgentEnding>,
    ) -> Verdict<RunWithTask> {
        let held = std::mem::take(&mut *self.shared.held.lock().await);
        let (conversation, waiting) = match agent {
            Some(agent) => (agent.conversation, agent.step_id.map(|id| (id, agent.ttl))),
            None => (None, None),
        };
        let ended = |end| Verdict::Ended(RunEnding::new(held, end).with_conversation(conversation));
        match (outcome, waiting) {
            (Outcome::Completed { exit_code }, _) => ended(End::Completed { exit_code }),
            (Outcome::Failed { exit_code, error }, _) => ended(End::Failed { exit_code, error }),
            // What the context held back goes: the retry runs the attempt again.
            (Outcome::Retry { error }, _) => Verdict::Retry(error),
            (Outcome::Interrupted, _) => Verdict::Interrupted,
            (
                Outcome::AwaitingApproval {
                    summary,
                    incomplete,
                },
                Some((step_id, ttl)),
            ) => ended(End::AwaitingApproval {
                summary: ActionSummary::of_lines(&summary, incomplete),
                step_id,
                ttl,
            }),
            (Outcome::AwaitingApproval { .. }, None) => ended(End::Failed {
                exit_code: None,
                error: "an approval was asked for with no model call to cover".into(),
            }),
        }
    }
}

/// The runtime side of [`RunContext`]. Steps and artifacts are held back ([`Held`]) and
/// written, fenced, with the next write that must be durable: an output append, the end
/// of the attempt, or a flush [`HOLD_LIMIT`] after the first held row. A crash before
/// then loses only rows of an attempt that will run again.
pub(crate) struct FencedContext {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) fence: Fence,
    pub(crate) task_id: String,
    pub(crate) run_id: String,
    artifact_max_bytes: i64,
    pub(crate) content: ContentStore,
    /// Held across a flush's transaction, so rows are written once and in order.
    pub(crate) held: Mutex<Held>,
    hooks: Option<AttemptHooks>,
}

/// Removes everything in `directory` but the directory itself. Nothing of the run's is
/// running then, and `remove_dir_all` removes symbolic links, never what they point to.
async fn empty(directory: &Path) -> std::io::Result<()> {
    let mut entries = tokio::fs::read_dir(directory).await?;
    while let Some(entry) = entries.next_entry().await? {
        if entry.file_type().await?.is_dir() {
            tokio::fs::remove_dir_all(entry.path()).await?;
        } else {
            tokio::fs::remove_file(entry.path()).await?;
        }
    }
    Ok(())
}

/// The workflow hooks (`after_create`, `before_run`, `after_run`) around an imported task's
/// attempts, run by the worker that runs the attempt, in its workspace, with its
/// environment and sandbox.
pub(crate) struct AttemptHooks {
    hooks: Hooks,
    workspace: PathBuf,
    env: Vec<(String, String)>,
    sandbox: keel_workers::SandboxPolicy,
}

/// Rows the executor reported and the database does not have yet, in the order reported.
#[derive(Default)]
pub(crate) struct Held {
    writes: Vec<HeldWrite>,
    /// Artifact handles to the ids of their rows (a takeover reopens an older row).
    artifact_ids: HashMap<String, String>,
    /// Whether a flush after [`HOLD_LIMIT`] is on its way.
    flush_due: bool,
}

enum HeldWrite {
    Step {
        id: String,
        name: String,
        input: serde_json::Value,
        started_at: DateTime<Utc>,
        /// Set when the step ended before it was written: one insert, both events.
        ended: Option<(StepResult, DateTime<Utc>)>,
    },
    /// Where a step's end goes in the event order; `folded` when [`HeldWrite::Step`] has it.
    EndStep {
        id: String,
        result: StepResult,
        at: DateTime<Utc>,
        folded: bool,
    },
    Artifact {
        handle: String,
        name: &'static str,
        closed: bool,
    },
    /// `folded` when the [`HeldWrite::Artifact`] is written closed.
    Close { handle: String, folded: bool },
}

/// What a flush wrote, in order, for its events.
#[derive(Default)]
struct Written {
    steps: Vec<StepRecord>,
    artifacts: Vec<Upserted>,
    order: Vec<Slot>,
}

enum Slot {
    StepStarted(usize),
    StepEnded(usize),
    ArtifactCreated(usize),
}

impl Written {
    fn events<'a>(&'a self, owner: Subject<'a>) -> Vec<NewEvent<'a>> {
        self.order
            .iter()
            .filter_map(|slot| match *slot {
                Slot::StepStarted(i) => Some(steps::started_event(&self.steps[i])),
                Slot::StepEnded(i) => Some(steps::finished_event(&self.steps[i])),
                Slot::ArtifactCreated(i) => artifacts::created_event(owner, &self.artifacts[i]),
            })
            .collect()
    }

    fn step_index(&self, id: &str) -> Option<usize> {
        self.steps.iter().rposition(|s| s.id == id)
    }
}

impl Held {
    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    fn hold(&mut self, write: HeldWrite) {
        self.writes.push(write);
    }

    /// Ends a step: folded into its held insert when it has not been written yet.
    fn end_step(&mut self, id: &str, result: StepResult) {
        let at = Utc::now();
        let held = self.writes.iter_mut().find_map(|w| match w {
            HeldWrite::Step {
                id: held, ended, ..
            } if held == id => Some(ended),
            _ => None,
        });
        let folded = match held {
            Some(ended) => {
                *ended = Some((result.clone(), at));
                true
            }
            None => false,
        };
        self.hold(HeldWrite::EndStep {
            id: id.to_string(),
            result,
            at,
            folded,
        });
    }

    fn close(&mut self, handle: &str) {
        let held = self.writes.iter_mut().find_map(|w| match w {
            HeldWrite::Artifact {
                handle: h, closed, ..
            } if h == handle => Some(closed),
            _ => None,
        });
        let folded = held.map(|closed| *closed = true).is_some();
        self.hold(HeldWrite::Close {
            handle: handle.to_string(),
            folded,
        });
    }

    /// The id of the row an artifact handle stands for.
    fn artifact_id<'a>(&'a self, handle: &'a str) -> &'a str {
        self.artifact_ids.get(handle).map_or(handle, String::as_str)
    }

    /// Writes the held rows in the caller's transaction, recording what it wrote in
    /// `written`; the rows stay held until the caller commits and clears them.
    async fn write(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        (task_id, run_id): (&str, &str),
        written: &mut Written,
    ) -> Result<HashMap<String, String>, StoreError> {
        let owner = Subject::Run { task_id, run_id };
        let mut ids = self.artifact_ids.clone();
        for write in &self.writes {
            match write {
                HeldWrite::Step {
                    id,
                    name,
                    input,
                    started_at,
                    ended,
                } => {
                    let step = NewStep {
                        id,
                        task_id,
                        run_id,
                        name,
                        input,
                        started_at: *started_at,
                        ended: ended.as_ref().map(|(result, at)| (result, *at)),
                    };
                    written.steps.push(steps::insert(conn, scope, &step).await?);
                    written
                        .order
                        .push(Slot::StepStarted(written.steps.len() - 1));
                }
                HeldWrite::EndStep {
                    id,
                    result,
                    at,
                    folded,
                } => {
                    let index = match (folded, written.step_index(id)) {
                        (true, Some(index)) => index,
                        _ => {
                            written
                                .steps
                                .push(steps::end(conn, scope, id, result, *at).await?);
                            written.steps.len() - 1
                        }
                    };
                    written.order.push(Slot::StepEnded(index));
                }
                HeldWrite::Artifact {
                    handle,
                    name,
                    closed,
                } => {
                    let artifact = NewArtifact {
                        id: handle,
                        owner,
                        name,
                        kind: name,
                        content_type: "text/plain",
                        closed: *closed,
                    };
                    let upserted = artifacts::upsert(conn, scope, &artifact).await?;
                    ids.insert(handle.clone(), upserted.artifact.id.clone());
                    written.artifacts.push(upserted);
                    written
                        .order
                        .push(Slot::ArtifactCreated(written.artifacts.len() - 1));
                }
                HeldWrite::Close { folded: true, .. } => {}
                HeldWrite::Close { handle, .. } => {
                    let id = ids.get(handle).map_or(handle.as_str(), String::as_str);
                    artifacts::close(conn, scope, id).await?;
                }
            }
        }
        Ok(ids)
    }
}

impl Shared {
    /// A hook's stdout and stderr as two closed artifacts of the run (`<hook>.stdout` of
    /// kind `stdout`, `<hook>.stderr` of kind `stderr`), in one fenced transaction.
    async fn record_hook(&self, ran: &HookRun) -> Result<(), ContextError> {
        let mut tx = self.fence.begin().await?;
        let scope = &self.fence.scope;
        let streams = [("stdout", &ran.stdout), ("stderr", &ran.stderr)];
        for (stream, text) in streams {
            let name = format!("{}.{stream}", ran.hook);
            let written = async {
                let content_type = "text/plain; charset=utf-8";
                let owner = self.owner();
                let artifact =
                    artifacts::open(&mut tx, scope, owner, &name, stream, content_type).await?;
                let bytes = text.as_bytes();
                self.content
                    .append(&mut tx, scope, &artifact.id, bytes, self.artifact_max_bytes)
                    .await?;
                artifacts::close(&mut tx, scope, &artifact.id).await
            };
            written.await.map_err(|e| self.fence.context_error(e))?;
        }
        self.fence.commit(tx).await
    }

    pub(crate) fn owner(&self) -> Subject<'_> {
        Subject::Run {
            task_id: &self.task_id,
            run_id: &self.run_id,
        }
    }

    /// Writes the held rows, then `then` (a durable write that needs them), in one fenced
    /// transaction with their events.
    pub(crate) async fn flush_with(
        &self,
        held: &mut Held,
        then: Option<(&str, &[u8])>,
    ) -> Result<(), ContextError> {
        let mut tx = self.fence.begin().await?;
        let scope = &self.fence.scope;
        let mut written = Written::default();
        let ids = held
            .write(&mut tx, scope, (&self.task_id, &self.run_id), &mut written)
            .await
            .map_err(|e| self.fence.context_error(e))?;
        events::append(&mut tx, scope, &written.events(self.owner()))
            .await
            .map_err(|e| self.fence.context_error(e))?;
        if let Some((handle, bytes)) = then {
            let id = ids.get(handle).map_or(handle, String::as_str);
            self.content
                .append(&mut tx, scope, id, bytes, self.artifact_max_bytes)
                .await
                .map_err(|e| self.fence.context_error(e))?;
        }
        self.fence.commit(tx).await?;
        held.writes.clear();
        held.artifact_ids = ids;
        Ok(())
    }

    /// Holds a row, and makes sure it is written within [`HOLD_LIMIT`].
    async fn hold(self: &Arc<Self>, update: impl FnOnce(&mut Held)) -> Result<(), ContextError> {
        if self.fence.interrupt.is_cancelled() {
            return Err(ContextError::Interrupted);
        }
        let mut held = self.held.lock().await;
        update(&mut held);
        if !held.flush_due {
            held.flush_due = true;
            let shared = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(HOLD_LIMIT).await;
                let mut held = shared.held.lock().await;
                held.flush_due = false;
                if held.writes.is_empty() || shared.fence.interrupt.is_cancelled() {
                    return;
                }
                // A failure leaves the rows held for the next durable write, which then
                // reports it.
                if let Err(error) = shared.flush_with(&mut held, None).await {
                    tracing::warn!(%error, "writing a run's held steps and artifacts failed");
                }
            });
        }
        Ok(())
    }
}

impl RunContext for FencedContext {
    fn cancellation(&self) -> &CancellationToken {
        &self.shared.fence.interrupt
    }

    async fn clear_ahead(&self) -> Result<(), ContextError> {
        self.shared.fence.clear_ahead().await
    }

    async fn start_step(
        &self,
        name: &str,
        input: serde_json::Value,
    ) -> Result<StepHandle, ContextError> {
        let id = new_id("step");
        let step = HeldWrite::Step {
            id: id.clone(),
            name: name.to_string(),
            input,
            started_at: Utc::now(),
            ended: None,
        };
        self.shared.hold(|held| held.hold(step)).await?;
        Ok(StepHandle(id))
    }

    async fn finish_step(&self, step: &StepHandle, result: StepResult) -> Result<(), ContextError> {
        self.shared
            .hold(|held| held.end_step(&step.0, result))
            .await
    }

    async fn open_output(&self, stream: OutputStream) -> Result<ArtifactHandle, ContextError> {
        let handle = new_id("art");
        let artifact = HeldWrite::Artifact {
            handle: handle.clone(),
            name: stream.name(),
            closed: false,
        };
        self.shared.hold(|held| held.hold(artifact)).await?;
        Ok(ArtifactHandle(handle))
    }

    async fn append_output(
        &self,
        artifact: &ArtifactHandle,
        bytes: &[u8],
    ) -> Result<(), ContextError> {
        let shared = &self.shared;
        if shared.fence.interrupt.is_cancelled() {
            return Err(ContextError::Interrupted);
        }
        let mut held = shared.held.lock().await;
        if !held.writes.is_empty() {
            return shared
                .flush_with(&mut held, Some((&artifact.0, bytes)))
                .await;
        }
        let id = held.artifact_id(&artifact.0).to_string();
        drop(held);
        let mut tx = shared.fence.begin().await?;
        shared
            .content
            .append(
                &mut tx,
                &shared.fence.scope,
                &id,
                bytes,
                shared.artifact_max_bytes,
            )
            .await
            .map_err(|e| shared.fence.context_error(e))?;
        shared.fence.commit(tx).await
    }

    async fn close_output(&self, artifact: &ArtifactHandle) -> Result<(), ContextError> {
        self.shared.hold(|held| held.close(&artifact.0)).await
    }
}
