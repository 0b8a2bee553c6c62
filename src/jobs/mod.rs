//! The job kinds ([`JobKind`]) at work: each kind's handler, built from the worker's
//! settings, and each kind's requeue of a row a lost worker left running (the reconciler's).
//! Features own their handlers; the `run` kind is composed here because a run is driven
//! either by the process executor (`runs`) or by the agent loop (`agent`), which builds on
//! the run's attempt.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::PgConnection;
use sqlx::PgPool;

use crate::agent::{self, AgentJobs};
use crate::artifacts::content::ContentStore;
use crate::attempt;
use crate::attempt::JobKind;
use crate::config::{Common, WorkerArgs};
use crate::db::StoreError;
use crate::domain::{Actor, RunStatus};
use crate::events;
use crate::external::actions::job::ActionJobs;
use crate::external::poll::PollJobs;
use crate::external::tracker::Poller;
use crate::media::MediaJobStatus;
use crate::media::job::MediaJobs;
use crate::providers::secrets::SecretPolicy;
use crate::queue::Lease;
use crate::queue::worker::{Job, JobHandler};
use crate::runs::job::RunJobs;
use crate::runs::{self, AdmissionRules, RunWithTask};

/// The `run` kind: an attempt of a run, begun as every run's is, then driven by the process
/// executor or, for an `agent_loop` task, by the agent loop.
pub(crate) struct Runs {
    pub(crate) runs: RunJobs,
    pub(crate) agent: AgentJobs,
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
    /// Runs one attempt; returns its outcome, as the job duration metric labels it.
    async fn execute(&self, job: Job) -> Result<&'static str, StoreError> {
        let Some(row) = attempt::begin::<RunWithTask>(&self.runs.pool, &job.lease, &()).await?
        else {
            return Ok("skipped");
        };
        if row.task.is_agent_loop() {
            return agent::execute(&self.runs, &self.agent, job, row).await;
        }
        self.runs.execute_process(job, row).await
    }
}

/// What the handlers are built from, beside the worker's settings.
pub struct Setup<'a> {
    pub pool: &'a PgPool,
    pub rules: &'a AdmissionRules,
    pub secrets: &'a SecretPolicy,
    pub content: &'a ContentStore,
    /// Where the runs' ephemeral workspaces go.
    pub data_dir: &'a std::path::Path,
}

/// Every kind's handler.
pub fn handlers(setup: Setup<'_>, common: &Common, args: &WorkerArgs) -> Vec<Arc<dyn JobHandler>> {
    let Setup {
        pool,
        rules,
        secrets,
        content,
        data_dir,
    } = setup;
    let runs = Arc::new(Runs {
        runs: RunJobs {
            pool: pool.clone(),
            data_dir: data_dir.to_path_buf(),
            artifact_max_bytes: args.artifact_max_bytes,
            content: content.clone(),
            timeouts: rules.timeouts,
            workspace_roots: rules.workspace_roots.clone(),
            passthrough_env: args.passthrough_env(),
            secrets: secrets.clone(),
        },
        agent: AgentJobs {
            approvals: rules.approvals.clone(),
            approval_ttl: rules.approval_ttl,
            prices: common.model_prices.clone(),
            secrets: secrets.clone(),
            provider_hosts: common.provider_hosts(),
            chat: common.chat.limits(),
            system_prompt: Some(common.agent_system_prompt.clone())
                .filter(|prompt| !prompt.trim().is_empty()),
            mcp_call_timeout: Duration::from_millis(common.mcp_call_timeout_ms),
            mcp_connect_timeout: Duration::from_millis(common.mcp_connect_timeout_ms),
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
        content: content.clone(),
        secrets: secrets.clone(),
        hosts: common.provider_hosts(),
    });
    vec![runs, media, polls, actions]
}

/// Puts the domain row of a job whose lease expired back to `queued`, with its gap event,
/// when its worker left it running; rows of the other kinds hold no running state.
pub async fn requeue_lost(conn: &mut PgConnection, lease: &Lease) -> Result<(), StoreError> {
    const REASON: &str = "worker_lease_expired";
    let system = &Actor::System;
    let scope = &lease.scope();
    let Some(kind) = JobKind::parse(&lease.kind) else {
        return Ok(());
    };
    match kind {
        JobKind::Run => {
            let run = runs::get_by_id(conn, scope, &lease.ref_id).await?;
            if run.status() == RunStatus::Running {
                let (_, gap) = runs::requeue_lost(conn, scope, &run, REASON, system).await?;
                events::append(conn, scope, &gap).await?;
            }
        }
        JobKind::Media => {
            let job = crate::media::lock(conn, scope, &lease.ref_id).await?;
            if job.status() == MediaJobStatus::Running {
                let (_, queued) =
                    crate::media::requeue_lost(conn, scope, &job.id, REASON, system).await?;
                events::append(conn, scope, &[queued]).await?;
            }
        }
        JobKind::Poll | JobKind::ExternalAction => {}
    }
    Ok(())
}
