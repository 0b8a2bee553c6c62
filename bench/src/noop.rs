//! The bench's job kind: a no-op executor on the production worker. It acks each job
//! with the statement every kind settles with ([`keel::queue::settle_many`]: fenced by the
//! job's own token and owner, archived to `lease_history`), batched with the acks queued
//! alongside it ([`Acks`]), its slot freed as soon as the ack is queued, and tells the
//! bench when a job started and when its ack committed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use sqlx::PgPool;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use keel::config::WorkerArgs;
use keel::db;
use keel::queue::worker::{Job, JobHandler};
use keel::queue::{Disposition, Lease, QueueError, QueuePool, Settlement, settle_many};

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

/// The most acks one statement carries.
const BATCH: usize = 1_000;

/// Where an ack's answer goes: Some(true) settled, Some(false) the lease was lost, None
/// the statement failed (the ack is tried again alone).
type Reply = oneshot::Sender<Option<bool>>;

/// An ack, the worker holding its lease, and its reply.
type Request = (Settlement, String, Reply);

/// The bench kind's acks, batched: every ack queued while the previous statement ran goes
/// in the next one, each row fenced by its own token, so no ack waits for a timer and a
/// job's slot frees before its ack commits. Production kinds settle one by one, inside
/// their terminal transaction: batching those would let one failure roll back others'
/// outcomes.
#[derive(Clone)]
struct Acks {
    queue: QueuePool,
    requests: mpsc::UnboundedSender<Request>,
    /// One permit per ack pending (queued and not yet answered): a handler returns before
    /// its ack commits, so without a bound a worker whose acks are slower than its claims
    /// (an old snapshot held) would pile up acks, and their unrenewed leases, without end.
    /// Beyond it, a job keeps its slot until an earlier ack commits, and the worker claims
    /// less.
    room: Arc<Semaphore>,
    bound: usize,
}

impl Acks {
    /// Acks on a queue connection of their own (the statement runs as the worker's own
    /// settles do, prepared and planned with its values), at most `bound` pending.
    fn start(pool: &PgPool, bound: usize) -> Acks {
        let queue = QueuePool::new(pool, 1);
        // Opened beside the worker's start rather than in front of the first ack.
        let opening = queue.clone();
        tokio::spawn(async move { opening.pool().acquire().await.map(drop) });
        let (requests, queued) = mpsc::unbounded_channel();
        tokio::spawn(ack_batches(queue.clone(), queued));
        Acks {
            queue,
            requests,
            room: Arc::new(Semaphore::new(bound)),
            bound,
        }
    }

    /// Queues the ack once there is room for it; the receipt resolves once it committed
    /// (or `LeaseLost`).
    async fn submit(
        &self,
        lease: &Lease,
    ) -> impl Future<Output = Result<(), QueueError>> + Send + 'static {
        let permit = self
            .room
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let settlement = Settlement::of(lease, Disposition::Complete);
        let owner = lease.owner.clone();
        let (reply, answer) = oneshot::channel();
        let queued = self
            .requests
            .send((settlement.clone(), owner.clone(), reply))
            .is_ok();
        let queue = self.queue.clone();
        async move {
            let answered = if queued {
                answer.await.ok().flatten()
            } else {
                None
            };
            let settled = match answered {
                Some(settled) => Ok(settled),
                // The batch failed: alone, so this job gets its own answer (or error).
                None => settle_many(&queue, &owner, std::slice::from_ref(&settlement))
                    .await
                    .map(|ids| !ids.is_empty()),
            };
            drop(permit);
            match settled? {
                true => Ok(()),
                false => Err(QueueError::LeaseLost),
            }
        }
    }

    /// Waits (at most `timeout`) for the acks still pending when the worker stopped to
    /// commit: a process that exited with them queued would leave their jobs to run again
    /// once their leases expired.
    async fn drain(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.room.available_permits() < self.bound && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Settles what the jobs sent, one statement per batch: whatever arrived while the
/// previous statement ran goes in the next. Ends when every sender is gone.
async fn ack_batches(queue: QueuePool, mut queued: mpsc::UnboundedReceiver<Request>) {
    let mut batch = Vec::with_capacity(BATCH);
    while queued.recv_many(&mut batch, BATCH).await > 0 {
        // A statement settles the jobs of one worker; a bench process runs one.
        let mut by_owner: HashMap<String, Vec<(Settlement, Reply)>> = HashMap::new();
        for (settlement, owner, reply) in batch.drain(..) {
            by_owner.entry(owner).or_default().push((settlement, reply));
        }
        for (owner, requests) in by_owner {
            let settlements: Vec<Settlement> = requests.iter().map(|r| r.0.clone()).collect();
            let started = Instant::now();
            let settled = match settle_many(&queue, &owner, &settlements).await {
                Ok(ids) => {
                    tracing::debug!(jobs = settlements.len(), elapsed = ?started.elapsed(), "acked a batch");
                    Some(ids.into_iter().collect::<HashSet<i64>>())
                }
                Err(error) => {
                    tracing::warn!(%error, jobs = settlements.len(), "acking a batch failed; acking one by one");
                    None
                }
            };
            for (settlement, reply) in requests {
                let answer = settled.as_ref().map(|ids| ids.contains(&settlement.job_id));
                let _ = reply.send(answer);
            }
        }
    }
}

pub struct BenchJobs {
    probe: Probe,
    acks: Acks,
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
            // The ack is queued now; the slot frees while it commits with its batch.
            let receipt = self.acks.submit(&job.lease).await;
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
    // Twice the jobs the worker holds (concurrency + prefetch): room for a batch in flight
    // and the acks queued behind it. With once, a batch in flight filled the bound and
    // stalled the slots (the queue figure fell by about a sixth).
    let acks = Acks::start(&pool, 2 * (args.concurrency + args.prefetch));
    let handler = Arc::new(BenchJobs {
        probe,
        acks: acks.clone(),
    });
    // The bench database has no schedules, so no admission rules are needed.
    let rules = keel::runs::AdmissionRules::default();
    let worked = keel::cli::run_worker_with(pool, rules, args, vec![handler], shutdown).await;
    acks.drain(Duration::from_millis(args.drain_timeout_ms))
        .await;
    worked
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use keel::db::embedded::{Durability, EmbeddedPostgres};
    use keel::domain::Scope;

    use super::*;

    /// The bench kind acks every job, fenced and archived, many to a statement. (The
    /// statement's fence, row by row, is `tests/it/queue.rs`'s
    /// `a_batched_ack_is_fenced_row_by_row`.)
    #[tokio::test(flavor = "multi_thread")]
    async fn every_job_is_acked_and_archived() {
        let dir = tempfile::tempdir().unwrap();
        // Run as root, the cluster runs as the `postgres` user: it must reach the directory.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.path().join("postgres");
        let cluster = tokio::task::spawn_blocking(move || {
            EmbeddedPostgres::start(&root, Durability::Throwaway)
        })
        .await
        .unwrap()
        .expect("a throwaway cluster");
        let url = cluster.url("postgres");
        let pool = db::connect(&url, 2, "bench-test").await.unwrap();
        db::migrate(&pool).await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        for i in 0..40 {
            keel::queue::enqueue(&mut conn, &Scope::local(), KIND, &format!("j-{i}"), 0)
                .await
                .unwrap();
        }
        drop(conn);

        let probe = Probe::default();
        let worker = InProcess::start(&url, 4, 8, probe.clone()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(30), probe.wait_acked(40))
            .await
            .expect("every job acked");
        worker.stop().await.unwrap();
        let acked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM lease_history WHERE outcome = 'acked' AND kind = $1",
        )
        .bind(KIND)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(acked, 40, "every ack archived");
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM queue_jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(left, 0, "no job left behind");
        pool.close().await;
        tokio::task::spawn_blocking(move || cluster.stop())
            .await
            .unwrap();
    }
}
