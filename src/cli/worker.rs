//! The worker process: the sandbox it runs attempts in, every kind's handler
//! ([`crate::jobs`]), boot recovery, the maintenance duties and the workspace sweeps beside
//! the worker itself.

use std::sync::Arc;

use anyhow::Context;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::config::{Common, WorkerArgs};
use crate::jobs;
use crate::queue::worker::{JobHandler, Worker};
use crate::runs::AdmissionRules;

/// Runs a worker process's duties until `shutdown` fires.
pub async fn run_worker(
    pool: PgPool,
    common: &Common,
    args: &WorkerArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let rules = common.admission_rules().map_err(anyhow::Error::msg)?;
    let secrets = common.secrets.policy().map_err(anyhow::Error::msg)?;
    let content = common.content.store()?;
    let data_dir = canonical_data_dir(&common.data_dir)?;
    sandbox(common, &data_dir)?;
    tracing::info!(
        containment = %keel_workers::containment_name(),
        limits = %keel_workers::limits_in_effect(),
        passthrough = ?args.run_env_passthrough,
        "run sandbox"
    );
    let setup = jobs::Setup {
        pool: &pool,
        rules: &rules,
        secrets: &secrets,
        content: &content,
        data_dir: &data_dir,
    };
    let handlers = jobs::handlers(setup, common, args);
    let sweep = crate::maintenance::workspaces::WorkspaceSweep {
        root: crate::runs::job::ephemeral_root(&data_dir),
        retention: std::time::Duration::from_millis(common.workspace_retention_ms),
    };
    let sweeping = CancellationToken::new();
    tokio::spawn(sweep.run(pool.clone(), args.reconcile_interval(), sweeping.clone()));
    let removing = crate::maintenance::item_workspaces::run(
        pool.clone(),
        args.reconcile_interval(),
        std::time::Duration::from_millis(args.lease_ms),
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

/// The data directory, created where missing, by its canonical path: workspaces beneath it
/// are opened by their path with no link allowed on the way.
fn canonical_data_dir(data_dir: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    let workspaces = crate::runs::job::ephemeral_root(data_dir);
    std::fs::create_dir_all(&workspaces)
        .with_context(|| format!("creating {}", workspaces.display()))?;
    data_dir
        .canonicalize()
        .with_context(|| format!("resolving {}", data_dir.display()))
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
    crate::queue::reach::retry_while_unreachable(
        "boot recovery",
        crate::queue::reach::STARTUP_PATIENCE,
        &shutdown,
        crate::db::StoreError::is_unreachable,
        || crate::maintenance::recover(&pool),
    )
    .await
    .context("boot recovery")?;
    let maintenance = CancellationToken::new();
    tokio::spawn(crate::maintenance::run(
        pool.clone(),
        rules,
        args.reconcile_interval(),
        args.history_retention_days,
        maintenance.clone(),
    ));
    let settings = args.settings().map_err(anyhow::Error::msg)?;
    let worker = Worker::new(pool, settings, handlers);
    let result = worker.run(shutdown).await;
    maintenance.cancel();
    result.context("worker")
}
