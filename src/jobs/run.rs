//! The `run` job: drives one run through an executor. Every write it makes on the run's
//! behalf happens in a transaction fenced by the job's lease, so a worker that lost its
//! lease (paused, partitioned, presumed dead) cannot change the run afterwards.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use keel_workers::{
    ArtifactHandle, ContextError, Outcome, OutputStream, RunContext, RunSpec, StepHandle,
    StepResult,
};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

use super::fence::{self, DomainRow, Fence};
use crate::domain::task::{RunTimeouts, WorkspaceRoots};
use crate::domain::{Actor, EventType, RunStatus, Scope};
use crate::queue::worker::{Job, JobHandler};
use crate::queue::{self, Lease};
use crate::store::content::ContentStore;
use crate::store::events::{self, NewEvent, Subject};
use crate::store::runs::{self, Change, RunRecord};
use crate::store::tasks::{self, TaskRecord};
use crate::store::{StoreError, artifacts, steps};
use crate::telemetry::metrics;

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
}

/// Where a worker keeps its runs' ephemeral workspaces, one directory per run id.
pub fn ephemeral_root(data_dir: &Path) -> PathBuf {
    data_dir.join("workspaces")
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
        super::observe(queue::RUN_KIND, ref_id, span, async move {
            self.execute(job).await
        })
    }
}

impl DomainRow for RunRecord {
    fn lock(
        conn: &mut PgConnection,
        scope: &Scope,
        id: &str,
    ) -> impl Future<Output = Result<Self, StoreError>> + Send {
        runs::lock(conn, scope, id)
    }

    fn has_ended(&self) -> bool {
        self.status().is_terminal()
    }
}

impl RunJobs {
    /// Runs one attempt; returns its outcome, as the job duration metric labels it.
    async fn execute(&self, job: Job) -> Result<&'static str, StoreError> {
        let lease = &job.lease;
        let Some((task, run)) = self.begin(lease).await? else {
            return Ok("skipped");
        };
        let spec = match self.spec(&task, &run).await {
            Ok(spec) => spec,
            Err(error) => {
                let outcome = Outcome::Failed {
                    exit_code: None,
                    error,
                };
                self.finish(lease, &run, outcome).await?;
                return Ok("failed");
            }
        };
        let ctx = FencedContext {
            fence: Fence::new(&self.pool, &job),
            task_id: task.id.clone(),
            run_id: run.id.clone(),
            artifact_max_bytes: self.artifact_max_bytes,
            content: self.content.clone(),
        };
        match keel_workers::execute(&spec, &ctx).await {
            Outcome::Interrupted if job.is_released() => {
                self.hand_back(lease, &run).await?;
                Ok("released")
            }
            Outcome::Interrupted => {
                tracing::info!(
                    "attempt interrupted (run cancelled or lease lost); writing nothing more"
                );
                // A cancel that found the job row locked left it to this worker.
                match fence::lock_unless_ended::<RunRecord>(&self.pool, lease).await {
                    Ok(_) | Err(StoreError::LeaseLost) => Ok("interrupted"),
                    Err(error) => Err(error),
                }
            }
            Outcome::Retry { error } => {
                self.nack(lease, &run, &error).await?;
                Ok("retried")
            }
            outcome @ Outcome::Completed { .. } => {
                self.finish(lease, &run, outcome).await?;
                Ok("completed")
            }
            outcome => {
                self.finish(lease, &run, outcome).await?;
                Ok("failed")
            }
        }
    }

    /// Marks the run running for this attempt. A run already `running` was held by a worker
    /// that lost its lease: its open work is closed and the gap recorded first. Returns None
    /// when there is nothing to run (the run already ended, or it used up its attempts).
    async fn begin(&self, lease: &Lease) -> Result<Option<(TaskRecord, RunRecord)>, StoreError> {
        let Some((mut tx, run)) = fence::lock_unless_ended::<RunRecord>(&self.pool, lease).await?
        else {
            return Ok(None);
        };
        let scope = lease.scope();
        let reclaimed = run.status() == RunStatus::Running;
        if reclaimed {
            disconnect(
                &mut tx,
                &scope,
                &run,
                "worker_lease_expired",
                &worker(lease),
            )
            .await?;
        }
        if lease.attempts > lease.max_attempts {
            let error = format!("gave up after {} attempts", lease.max_attempts);
            fail_and_ack(&mut tx, lease, &run, &error).await?;
            tx.commit().await?;
            count_reclaim(reclaimed, lease);
            return Ok(None);
        }
        let change = Change {
            worker_id: Some(&lease.owner),
            ..Change::default()
        };
        let run = runs::transition(
            &mut tx,
            &scope,
            &run.id,
            RunStatus::Running,
            change,
            &worker(lease),
            Some("claimed"),
        )
        .await?;
        let task = tasks::get(&mut tx, &scope, &run.task_id).await?;
        let data = serde_json::json!({ "attempt": run.attempt, "worker_id": lease.owner });
        events::append(
            &mut tx,
            &scope,
            &[NewEvent::new(&run.task_id, &run.id, EventType::RunStarted).with(data)],
        )
        .await?;
        tx.commit().await?;
        count_reclaim(reclaimed, lease);
        Ok(Some((task, run)))
    }

    async fn spec(&self, task: &TaskRecord, run: &RunRecord) -> Result<RunSpec, String> {
        let workspace = match &task.working_directory {
            Some(directory) if task.workspace_mode == "in_place" => self
                .workspace_roots
                .confine(directory, task.sandbox_allowed_root.as_deref())
                .map_err(|e| format!("workspace_refused: {}: {}", e.field, e.message))?,
            _ => {
                let path = ephemeral_root(&self.data_dir).join(run.workspace_owner());
                tokio::fs::create_dir_all(&path).await.map_err(|e| {
                    format!("could not create the workspace {}: {e}", path.display())
                })?;
                path
            }
        };
        Ok(RunSpec {
            execution: task.execution()?,
            workspace,
            sandbox: task.sandbox(),
            // Tasks stored before the timeout settings may have none, or a longer one.
            timeout: Some(Duration::from_millis(
                self.timeouts.effective_ms(task.timeout_ms).max(1) as u64,
            )),
            env: vec![
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
            .chain(self.passthrough_env.iter().cloned())
            .collect(),
            checkpoint: run.checkpoint.clone(),
        })
    }

    async fn finish(
        &self,
        lease: &Lease,
        run: &RunRecord,
        outcome: Outcome,
    ) -> Result<(), StoreError> {
        let mut tx = queue::begin_fenced(&self.pool, lease).await?;
        let scope = lease.scope();
        match outcome {
            Outcome::Completed { exit_code } => {
                let change = Change {
                    exit_code,
                    ..Change::default()
                };
                runs::transition(
                    &mut tx,
                    &scope,
                    &run.id,
                    RunStatus::Completed,
                    change,
                    &worker(lease),
                    Some("process exited 0"),
                )
                .await?;
                let data = serde_json::json!({ "exit_code": exit_code });
                let event = NewEvent::new(&run.task_id, &run.id, EventType::RunFinished).with(data);
                events::append(&mut tx, &scope, &[event]).await?;
                queue::complete(&mut tx, lease).await?;
            }
            Outcome::Failed { exit_code, error } => {
                let change = Change {
                    exit_code,
                    last_error: Some(&error),
                    ..Change::default()
                };
                runs::transition(
                    &mut tx,
                    &scope,
                    &run.id,
                    RunStatus::Failed,
                    change,
                    &worker(lease),
                    Some(&error),
                )
                .await?;
                let data = serde_json::json!({ "exit_code": exit_code, "error": error });
                let event = NewEvent::new(&run.task_id, &run.id, EventType::RunFailed).with(data);
                events::append(&mut tx, &scope, &[event]).await?;
                queue::complete(&mut tx, lease).await?;
            }
            Outcome::Interrupted | Outcome::Retry { .. } => unreachable!("not a final outcome"),
        }
        tx.commit().await?;
        Ok(())
    }

    /// The runtime failed under the attempt: retry with backoff, or give up at the limit.
    async fn nack(&self, lease: &Lease, run: &RunRecord, error: &str) -> Result<(), StoreError> {
        let mut tx = queue::begin_fenced(&self.pool, lease).await?;
        let scope = lease.scope();
        if lease.attempts >= lease.max_attempts {
            let error = format!("gave up after {} attempts: {error}", lease.attempts);
            fail_and_ack(&mut tx, lease, run, &error).await?;
        } else {
            runs::transition(
                &mut tx,
                &scope,
                &run.id,
                RunStatus::Queued,
                Change::default(),
                &worker(lease),
                Some(error),
            )
            .await?;
            runs::close_open_work(&mut tx, &scope, &run.id, "failed", error).await?;
            let data = serde_json::json!({ "reason": "retry", "error": error });
            let event = NewEvent::new(&run.task_id, &run.id, EventType::RunQueued).with(data);
            queue::retry(&mut tx, lease, error, queue::backoff(lease.attempts), true).await?;
            events::append(&mut tx, &scope, &[event]).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Gives a job back at shutdown so another worker takes it at once, without penalty.
    async fn hand_back(&self, lease: &Lease, run: &RunRecord) -> Result<(), StoreError> {
        let mut tx = queue::begin_fenced(&self.pool, lease).await?;
        let scope = lease.scope();
        let run = runs::get_by_id(&mut tx, &scope, &run.id).await?;
        queue::retry(&mut tx, lease, "worker shut down", Duration::ZERO, false).await?;
        disconnect(&mut tx, &scope, &run, "worker_shutdown", &worker(lease)).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Counts a takeover once it is committed.
fn count_reclaim(reclaimed: bool, lease: &Lease) {
    if reclaimed {
        metrics::reclaimed(&lease.kind);
    }
}

fn worker(lease: &Lease) -> Actor {
    Actor::Worker(lease.owner.clone())
}

/// Requeues a run whose worker is gone: closes what the attempt left open, records the
/// gap, and puts the run back to `queued`. Events are appended last (see store::events).
pub async fn disconnect(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &RunRecord,
    reason: &str,
    actor: &Actor,
) -> Result<(), StoreError> {
    runs::close_open_work(conn, scope, &run.id, "failed", "worker disconnected").await?;
    runs::transition(
        conn,
        scope,
        &run.id,
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
    events::append(
        conn,
        scope,
        &[
            NewEvent::new(&run.task_id, &run.id, EventType::GapRunDisconnected).with(gap),
            NewEvent::new(&run.task_id, &run.id, EventType::RunQueued)
                .with(serde_json::json!({ "reason": reason })),
        ],
    )
    .await
}

async fn fail_and_ack(
    conn: &mut PgConnection,
    lease: &Lease,
    run: &RunRecord,
    error: &str,
) -> Result<(), StoreError> {
    let change = Change {
        last_error: Some(error),
        ..Change::default()
    };
    let scope = lease.scope();
    runs::transition(
        conn,
        &scope,
        &run.id,
        RunStatus::Failed,
        change,
        &worker(lease),
        Some(error),
    )
    .await?;
    queue::complete(conn, lease).await?;
    let data = serde_json::json!({ "error": error });
    events::append(
        conn,
        &scope,
        &[NewEvent::new(&run.task_id, &run.id, EventType::RunFailed).with(data)],
    )
    .await
}

/// The runtime side of [`RunContext`]: each call is one fenced transaction.
struct FencedContext {
    fence: Fence,
    task_id: String,
    run_id: String,
    artifact_max_bytes: i64,
    content: ContentStore,
}

impl RunContext for FencedContext {
    fn cancellation(&self) -> &CancellationToken {
        &self.fence.interrupt
    }

    async fn start_step(
        &self,
        name: &str,
        input: serde_json::Value,
    ) -> Result<StepHandle, ContextError> {
        let mut tx = self.fence.begin().await?;
        let scope = &self.fence.scope;
        let step = steps::start(&mut tx, scope, &self.task_id, &self.run_id, name, &input)
            .await
            .map_err(|e| self.fence.context_error(e))?;
        self.fence.commit(tx).await?;
        Ok(StepHandle(step.id))
    }

    async fn finish_step(&self, step: &StepHandle, result: StepResult) -> Result<(), ContextError> {
        let mut tx = self.fence.begin().await?;
        let finished = match &result {
            StepResult::Completed { output } => {
                steps::finish(&mut tx, &self.fence.scope, &step.0, Some(output), None).await
            }
            StepResult::Failed { error } => {
                steps::finish(&mut tx, &self.fence.scope, &step.0, None, Some(error)).await
            }
        };
        finished.map_err(|e| self.fence.context_error(e))?;
        self.fence.commit(tx).await
    }

    async fn open_output(&self, stream: OutputStream) -> Result<ArtifactHandle, ContextError> {
        let mut tx = self.fence.begin().await?;
        let name = stream.name();
        let owner = Subject::Run {
            task_id: &self.task_id,
            run_id: &self.run_id,
        };
        let artifact = artifacts::open(&mut tx, &self.fence.scope, owner, name, name, "text/plain")
            .await
            .map_err(|e| self.fence.context_error(e))?;
        self.fence.commit(tx).await?;
        Ok(ArtifactHandle(artifact.id))
    }

    async fn append_output(
        &self,
        artifact: &ArtifactHandle,
        bytes: &[u8],
    ) -> Result<(), ContextError> {
        let mut tx = self.fence.begin().await?;
        self.content
            .append(
                &mut tx,
                &self.fence.scope,
                &artifact.0,
                bytes,
                self.artifact_max_bytes,
            )
            .await
            .map_err(|e| self.fence.context_error(e))?;
        self.fence.commit(tx).await
    }

    async fn close_output(&self, artifact: &ArtifactHandle) -> Result<(), ContextError> {
        let mut tx = self.fence.begin().await?;
        artifacts::close(&mut tx, &self.fence.scope, &artifact.0)
            .await
            .map_err(|e| self.fence.context_error(e))?;
        self.fence.commit(tx).await
    }
}
