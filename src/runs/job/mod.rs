//! The `run` job: drives one run through an executor. Every write it makes on the run's
//! behalf happens in a transaction fenced by the job's lease, so a worker that lost its
//! lease (paused, partitioned, presumed dead) cannot change the run afterwards.
//!
//! The attempt is begun here for every run ([`Runs`]) and driven by one of two executors:
//! the process executor ([`RunJobs::execute_process`]: shell, git, file), or, for an
//! `agent_loop` task, the agent loop, which `agent` builds on this attempt and plugs in
//! from above as a [`RunExecutor`].
//!
//! An attempt whose process writes no output is two transactions: the start (the run
//! `running`, `run.started`) and the end (its step and output artifacts, the run's
//! terminal state and events, the ack). The executor's step and artifact rows are held
//! back ([`FencedContext`]) and written with the next durable write (output bytes, the
//! end), or after [`HOLD_LIMIT`], so a long process's step shows up while it runs.

mod context;
mod ending;
mod hooks;
mod workspace;

pub(crate) use context::FencedContext;
pub(crate) use ending::RunEnding;
pub(crate) use hooks::Hooked;
pub(crate) use workspace::{ephemeral_root, workspace_dir};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use keel_workers::RunSpec;
use sqlx::PgPool;
use tokio::sync::Mutex;

use crate::artifacts::content::ContentStore;
use crate::attempt;
use crate::attempt::JobKind;
use crate::attempt::Verdict;
use crate::attempt::fence::Fence;
use crate::db::StoreError;
use crate::providers::secrets::SecretPolicy;
use crate::queue::worker::{Job, JobHandler};
use crate::runs::{RunRecord, RunWithTask};
use crate::tasks;
use crate::tasks::{RunTimeouts, WorkspaceRoots, resolve_secret};
use crate::tasks::{TaskRecord, TaskRecordExt};
use context::{Held, Shared};
use ending::End;
use hooks::{AttemptHooks, RepoClone, ResultPush, credential_answer};
use keel_workers::media::Secret;

/// The `run` kind: an attempt of a run, begun as every run's is, then driven by the
/// process executor or, for an `agent_loop` task, by the agent loop.
pub(crate) struct Runs {
    pub(crate) jobs: RunJobs,
    pub(crate) agent_loop: Arc<dyn RunExecutor>,
}

/// What drives a run's attempt once [`attempt::begin`] marked it running, to its
/// [`attempt::conclude`]; returns the outcome, as the job duration metric labels it.
pub(crate) trait RunExecutor: Send + Sync {
    fn execute<'a>(
        &'a self,
        jobs: &'a RunJobs,
        job: Job,
        row: RunWithTask,
    ) -> BoxFuture<'a, Result<&'static str, StoreError>>;
}

impl JobHandler for Runs {
    fn kind(&self) -> &'static str {
        JobKind::Run.as_str()
    }

    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()> {
        attempt::observed!(JobKind::Run, "run_job", run_id, job, async move {
            self.execute(job).await
        })
    }
}

impl Runs {
    async fn execute(&self, job: Job) -> Result<&'static str, StoreError> {
        let Some(row) = attempt::begin::<RunWithTask>(&self.jobs.pool, &job.lease, &()).await?
        else {
            return Ok("skipped");
        };
        match row.task.is_agent_loop() {
            true => self.agent_loop.execute(&self.jobs, job, row).await,
            false => self.jobs.execute_process(job, row).await,
        }
    }
}

pub(crate) struct RunJobs {
    pub(crate) pool: PgPool,
    /// Ephemeral workspaces live under `<data_dir>/workspaces/<run_id>` (a resumed run
    /// reuses the directory of the run it resumes).
    pub(crate) data_dir: PathBuf,
    pub(crate) artifact_max_bytes: i64,
    pub(crate) content: ContentStore,
    pub(crate) timeouts: RunTimeouts,
    /// Checked again before each `in_place` run: the directory or the roots may have
    /// changed since the API accepted the task.
    pub(crate) workspace_roots: WorkspaceRoots,
    /// The operator's `KEEL_RUN_ENV_PASSTHROUGH` variables, with this worker's values.
    pub(crate) passthrough_env: Vec<(String, String)>,
    /// Which secrets a repository's credential may name.
    pub(crate) secrets: SecretPolicy,
}

impl RunJobs {
    /// Runs one attempt of a process run (shell, git, file) that [`attempt::begin`] marked
    /// running; returns its outcome, as the job duration metric labels it.
    async fn execute_process(
        &self,
        job: Job,
        row: RunWithTask,
    ) -> Result<&'static str, StoreError> {
        let spec = match self.spec(&job, &row.task, &row.run).await? {
            Ok(spec) => spec,
            Err(error) => return self.fail(&job, &row, error).await,
        };
        let ctx = self.context(&job, &row);
        let outcome = self
            .around(&row, &ctx, keel_workers::execute(&spec, &ctx))
            .await;
        let verdict = ctx.verdict(outcome, None).await;
        attempt::conclude(&self.pool, &job, &row, &(), verdict).await
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
        attempt::conclude(&self.pool, job, row, &(), verdict).await
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
            }),
        }
    }

    /// Runs the attempt `body` within the task's workflow hooks and after its repository's
    /// clone, if it has either ([`AttemptHooks::around`]).
    pub(crate) async fn around<O: Hooked>(
        &self,
        row: &RunWithTask,
        ctx: &FencedContext,
        body: impl Future<Output = O>,
    ) -> O {
        match self.hooks(row, ctx.shared.fence.scope.workspace()) {
            Some(hooks) => hooks.around(ctx, body).await,
            None => body.await,
        }
    }

    /// What the clone's credential helper answers (None: the task names no credential), or
    /// why the credential cannot be used: the task's writer may no longer name it, or it
    /// does not resolve. Never logged.
    fn repo_credential(
        &self,
        row: &RunWithTask,
        workspace_id: &str,
    ) -> Result<Option<Secret>, String> {
        let Some(reference) = row.task.repo_credential.as_deref() else {
            return Ok(None);
        };
        let value = resolve_secret(reference, &self.secrets, row.written_by, workspace_id)
            .map_err(|why| format!("repo_credential: {why}"))?;
        Ok(Some(credential_answer(value.expose())))
    }

    /// What a task's attempts need to clone its repository and run its workflow hooks; None
    /// without either (or with a workspace the attempt will refuse anyway).
    fn hooks(&self, row: &RunWithTask, workspace_id: &str) -> Option<AttemptHooks> {
        let (task, run) = (&row.task, &row.run);
        let repo = task.repo.as_ref().map(|url| RepoClone {
            url: url.clone(),
            base_branch: task.base_branch.clone(),
            credential: self.repo_credential(row, workspace_id),
            timeout: self.timeout(task),
            push: task.push_branch.as_ref().map(|branch| ResultPush {
                branch: branch.clone(),
                message: format!("Keel run {} of task {}", run.id, task.id),
                date: format!("@{} +0000", run.created_at.timestamp()),
            }),
        });
        if row.hooks.is_none() && repo.is_none() {
            return None;
        }
        let workspace = workspace_dir(&self.workspace_roots, &self.data_dir, task, run).ok()?;
        Some(AttemptHooks {
            hooks: row.hooks.clone().unwrap_or_default(),
            repo,
            workspace,
            env: self.env(task, run),
            sandbox: task.sandbox(workspace_id),
        })
    }

    async fn spec(
        &self,
        job: &Job,
        task: &TaskRecord,
        run: &RunRecord,
    ) -> Result<Result<RunSpec, String>, StoreError> {
        let workspace = match self.workspace(task, run).await? {
            Ok(workspace) => workspace,
            Err(refused) => return Ok(Err(refused)),
        };
        Ok(task.execution().map(|execution| RunSpec {
            execution,
            workspace,
            sandbox: task.sandbox(job.lease.scope().workspace()),
            timeout: Some(self.timeout(task)),
            env: self.env(task, run),
            checkpoint: run.checkpoint.clone(),
        }))
    }

    /// The run's workspace directory, created if it is an ephemeral one; `Ok(Err(why))`
    /// when the run may not work there.
    pub(crate) async fn workspace(
        &self,
        task: &TaskRecord,
        run: &RunRecord,
    ) -> Result<Result<PathBuf, String>, StoreError> {
        let workspace = match workspace_dir(&self.workspace_roots, &self.data_dir, task, run) {
            Ok(workspace) => workspace,
            Err(refused) => return Ok(Err(refused)),
        };
        if task.workspace_mode == "in_place" {
            let mut conn = self.pool.acquire().await?;
            let directory = workspace.to_string_lossy();
            if tasks::in_place_nesting(&mut conn, &directory, Some(&task.id)).await? {
                let refused = tasks::NESTED_WORKSPACE;
                return Ok(Err(format!(
                    "workspace_refused: working_directory: {refused}"
                )));
            }
        }
        Ok(tokio::fs::create_dir_all(&workspace)
            .await
            .map(|()| workspace.clone())
            .map_err(|e| {
                format!(
                    "could not create the workspace {}: {e}",
                    workspace.display()
                )
            }))
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
