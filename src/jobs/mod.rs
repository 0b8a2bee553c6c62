//! The job kinds ([`JobKind`]) at work: each kind's handler, built from the worker's
//! settings, and each kind's requeue of a row a lost worker left running (the
//! reconciler's). Features own their handlers and rows; this is where they are put
//! together, the `run` kind's agent loop (`agent`) plugged into the run's attempt
//! (`runs::job`) from above.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgConnection;
use sqlx::PgPool;

use crate::agent::AgentJobs;
use crate::artifacts::content::ContentStore;
use crate::attempt;
use crate::attempt::JobKind;
use crate::config::{Common, WorkerArgs};
use crate::db::StoreError;
use crate::external::SourceRecord;
use crate::external::actions::ActionRecord;
use crate::external::actions::job::ActionJobs;
use crate::external::poll::PollJobs;
use crate::external::tracker::Poller;
use crate::external::triage::TriageJobs;
use crate::media::MediaJobRecord;
use crate::media::job::MediaJobs;
use crate::providers::secrets::SecretPolicy;
use crate::queue::Lease;
use crate::queue::worker::JobHandler;
use crate::runs::job::{RunJobs, Runs};
use crate::runs::{AdmissionRules, RunWithTask};
use keel_api_types::TriageScan;

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
        jobs: RunJobs {
            pool: pool.clone(),
            data_dir: data_dir.to_path_buf(),
            artifact_max_bytes: args.artifact_max_bytes,
            content: content.clone(),
            timeouts: rules.timeouts,
            workspace_roots: rules.workspace_roots.clone(),
            passthrough_env: args.passthrough_env(),
            secrets: secrets.clone(),
        },
        agent_loop: Arc::new(AgentJobs {
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
        }),
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
    let triage = Arc::new(TriageJobs {
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
    vec![runs, media, polls, actions, triage]
}

/// Puts the domain row of a job whose lease expired back to `queued`, with its gap event,
/// when its worker left it running ([`attempt::requeue_lost`], with the kind's row).
pub async fn requeue_lost(conn: &mut PgConnection, lease: &Lease) -> Result<(), StoreError> {
    match JobKind::parse(&lease.kind) {
        Some(JobKind::Run) => attempt::requeue_lost::<RunWithTask>(conn, lease).await,
        Some(JobKind::Media) => attempt::requeue_lost::<MediaJobRecord>(conn, lease).await,
        Some(JobKind::Poll) => attempt::requeue_lost::<SourceRecord>(conn, lease).await,
        Some(JobKind::ExternalAction) => attempt::requeue_lost::<ActionRecord>(conn, lease).await,
        Some(JobKind::CiTriage) => attempt::requeue_lost::<TriageScan>(conn, lease).await,
        None => Ok(()),
    }
}
