//! The worker process's work: each job kind's handler, built from the process's settings,
//! and the duties that run beside them (boot recovery, maintenance, workspace sweeps).
//! Features own their handlers; the `run` kind is composed here because a run is driven
//! either by the process executor (`runs`) or by the agent loop (`agent`), which builds on
//! the run's attempt.

use std::sync::Arc;

use anyhow::Context;
use futures_util::future::BoxFuture;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::agent::{self, AgentJobs};
use crate::attempt;
use crate::config::{Common, WorkerArgs};
use crate::db::StoreError;
use crate::external::actions::job::ActionJobs;
use crate::external::poll::PollJobs;
use crate::external::tracker::Poller;
use crate::media::job::MediaJobs;
use crate::queue;
use crate::queue::worker::{Job, JobHandler, Worker};
use crate::runs::job::RunJobs;
use crate::runs::{AdmissionRules, RunWithTask};

/// The `run` kind: an attempt of a run, begun as every run's is, then driven by the process
/// executor or, for an `agent_loop` task, by the agent loop.
pub(crate) struct Runs {
    pub(crate) runs: RunJobs,
    pub(crate) agent: AgentJobs,
}

impl JobHandler for Runs {
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
        attempt::observe(queue::RUN_KIND, ref_id, span, async move {
            self.execute(job).await
        })
    }
}

impl Runs {
    /// Runs one attempt; returns its outcome, as the job duration metric labels it.
    async fn execute(&self, job: Job) -> Result<&'static str, StoreError> {
        let Some(row) = attempt::begin::<RunWithTask>(&self.runs.pool, &job.lease).await? else {
            return Ok("skipped");
        };
        if row.task.is_agent_loop() {
            return agent::execute(&self.runs, &self.agent, job, row).await;
        }
        self.runs.execute_process(job, row).await
    }
}

pub async fn run_worker(
    pool: PgPool,
    common: &Common,
    args: &WorkerArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let rules = common.admission_rules().map_err(anyhow::Error::msg)?;
    let secrets = common.secrets.policy().map_err(anyhow::Error::msg)?;
    let content = common.content.store()?;
    let data_dir = std::path::absolute(&common.data_dir)?;
    sandbox(common, &data_dir)?;
    tracing::info!(
        containment = %keel_workers::containment_name(),
        passthrough = ?args.run_env_passthrough,
        "run sandbox"
    );
    let runs = Arc::new(Runs {
        runs: RunJobs {
            pool: pool.clone(),
            data_dir: data_dir.clone(),
            artifact_max_bytes: args.artifact_max_bytes,
            content: content.clone(),
            timeouts: rules.timeouts,
            workspace_roots: rules.workspace_roots.clone(),
            passthrough_env: args.passthrough_env(),
        },
        agent: AgentJobs {
            approvals: rules.approvals.clone(),
            approval_ttl: rules.approval_ttl,
            prices: common.model_prices.clone(),
            secrets: secrets.clone(),
            provider_hosts: common.provider_hosts(),
            chat: common.chat.limits(),
        },
    });
    let poller = Poller::new(
        pool.clone(),
        rules.clone(),
        content.clone(),
        secrets.clone(),
    );
    let actions = Arc::new(ActionJobs {
        poller: poller.clone(),
    });
    let polls = Arc::new(PollJobs { poller });
    let media = Arc::new(MediaJobs {
        pool: pool.clone(),
        limits: args.media.limits(),
        content,
        secrets,
        hosts: common.provider_hosts(),
    });
    let handlers: Vec<Arc<dyn JobHandler>> = vec![runs, media, polls, actions];
    let sweep = crate::maintenance::workspaces::WorkspaceSweep {
        root: crate::runs::job::ephemeral_root(&data_dir),
        retention: std::time::Duration::from_millis(common.workspace_retention_ms),
    };
    let sweeping = CancellationToken::new();
    tokio::spawn(sweep.run(pool.clone(), args.reconcile_interval(), sweeping.clone()));
    let removing = crate::maintenance::item_workspaces::run(
        pool.clone(),
        args.reconcile_interval(),
        sweeping.clone(),
    );
    tokio::spawn(removing);
    let result = run_worker_with(pool, rules, args, handlers, shutdown).await;
    sweeping.cancel();
    result
}

/// Sets how this process confines what it runs (the first role to call it decides), and
/// makes the ephemeral workspaces' directory one the attempts' uids can pass through.
fn sandbox(common: &Common, data_dir: &std::path::Path) -> anyhow::Result<()> {
    let settings = common.sandbox.settings().map_err(anyhow::Error::msg)?;
    let mode = keel_workers::configure_sandbox(settings).map_err(anyhow::Error::msg)?;
    if mode == keel_workers::SandboxMode::Isolated {
        let root = crate::runs::job::ephemeral_root(data_dir);
        if let Err(error) = keel_workers::open_workspace_root(&root) {
            tracing::error!(%error, "runs in ephemeral workspaces will fail with sandbox_unavailable");
        }
    }
    Ok(())
}

/// A worker process's duties around the given handlers: boot recovery, the maintenance
/// loop and the worker itself (`keel-bench` starts its no-op kind through this too).
pub async fn run_worker_with(
    pool: PgPool,
    rules: AdmissionRules,
    args: &WorkerArgs,
    handlers: Vec<Arc<dyn JobHandler>>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    crate::maintenance::recover(&pool)
        .await
        .context("boot recovery")?;
    let maintenance = CancellationToken::new();
    tokio::spawn(crate::maintenance::run(
        pool.clone(),
        rules,
        args.reconcile_interval(),
        maintenance.clone(),
    ));
    let settings = args.settings().map_err(anyhow::Error::msg)?;
    let worker = Worker::new(pool, settings, handlers);
    let result = worker.run(shutdown).await;
    maintenance.cancel();
    result.context("worker")
}
