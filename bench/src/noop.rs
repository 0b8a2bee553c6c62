//! The bench's job kind: a no-op executor on the production worker. It acks each job as
//! any job with no domain change acks ([`Job::ack`]: fenced by the job's own token,
//! batched with the acks queued alongside it, its slot freed as soon as the ack is
//! queued), and tells the bench when a job started and when its ack committed.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use sqlx::PgPool;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use keel::config::WorkerArgs;
use keel::db;
use keel::queue::worker::{Job, JobHandler};

pub const KIND: &str = "bench";
/// Jobs whose ref_id starts with this hold their lease until interrupted (the recovery
/// figure needs a worker that holds leases when it is killed).
pub const HOLD_PREFIX: &str = "hold-";

/// What the bench observes of its jobs, in this process and on its clock.
#[derive(Clone)]
pub struct Probe {
    starts: Option<mpsc::UnboundedSender<(String, Instant)>>,
    acked: Arc<watch::Sender<u64>>,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            starts: None,
            acked: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl Probe {
    /// A probe that also reports each job's (ref_id, executor start).
    pub fn with_starts() -> (Probe, mpsc::UnboundedReceiver<(String, Instant)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let probe = Probe {
            starts: Some(tx),
            ..Probe::default()
        };
        (probe, rx)
    }

    /// Jobs acked so far.
    pub fn acked(&self) -> u64 {
        *self.acked.borrow()
    }

    /// Waits until `count` jobs were acked.
    pub async fn wait_acked(&self, count: u64) {
        let mut acked = self.acked.subscribe();
        // The sender lives in self, so the channel cannot close while this waits.
        let _ = acked.wait_for(|n| *n >= count).await;
    }

    fn started(&self, ref_id: &str) {
        if let Some(starts) = &self.starts {
            let _ = starts.send((ref_id.to_string(), Instant::now()));
        }
    }
}

pub struct BenchJobs {
    probe: Probe,
}

impl JobHandler for BenchJobs {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()> {
        async move {
            self.probe.started(&job.lease.ref_id);
            if job.lease.ref_id.starts_with(HOLD_PREFIX) {
                job.interrupt.cancelled().await;
                return;
            }
            // The settle is queued now; the slot frees while it commits with its batch.
            let receipt = job.settle(keel::queue::Disposition::Complete);
            let (probe, job_id) = (self.probe.clone(), job.lease.job_id);
            tokio::spawn(async move {
                match receipt.await {
                    Ok(()) => probe.acked.send_modify(|n| *n += 1),
                    Err(error) => tracing::warn!(%error, job_id, "bench ack failed"),
                }
            });
        }
        .boxed()
    }
}

/// Runs a worker process's duties with the bench kind as its only handler, until
/// `shutdown` fires.
pub async fn run_worker(
    pool: PgPool,
    args: &WorkerArgs,
    probe: Probe,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let handler = Arc::new(BenchJobs { probe });
    // The bench database has no schedules, so no admission rules are needed.
    let rules = keel::runs::AdmissionRules::default();
    keel::cli::run_worker_with(pool, rules, args, vec![handler], shutdown).await
}

/// Worker settings for the bench: production defaults with the given concurrency,
/// prefetch and lease, and a short drain so stopping a worker does not wait on held jobs.
/// `KEEL_MAX_CONCURRENT_PER_WORKSPACE` in the bench's environment measures fair claims
/// (child workers read it themselves, as `keel worker` does).
pub fn worker_args(concurrency: usize, prefetch: usize, lease_ms: u64) -> WorkerArgs {
    WorkerArgs {
        concurrency,
        prefetch,
        lease_ms,
        lease_margin_ms: None,
        heartbeat_timeout_ms: None,
        poll_interval_ms: 1_000,
        drain_timeout_ms: 1_000,
        reconcile_interval_ms: 5_000,
        history_retention_days: 0,
        artifact_max_bytes: 0,
        max_concurrent_per_workspace: std::env::var("KEEL_MAX_CONCURRENT_PER_WORKSPACE")
            .ok()
            .and_then(|v| v.parse().ok()),
        run_env_passthrough: Vec::new(),
        media: Default::default(),
    }
}

/// A bench worker inside this process, so the bench sees its jobs start on its own clock.
pub struct InProcess {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl InProcess {
    pub async fn start(
        url: &str,
        concurrency: usize,
        prefetch: usize,
        probe: Probe,
    ) -> anyhow::Result<Self> {
        let pool = db::connect(url, super::worker_pool_size(concurrency), "bench-worker")
            .await
            .context("connecting the bench worker")?;
        let stop = CancellationToken::new();
        let args = worker_args(concurrency, prefetch, 30_000);
        let token = stop.clone();
        let task = tokio::spawn(async move { run_worker(pool, &args, probe, token).await });
        Ok(InProcess { stop, task })
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.task.await?
    }
}
