//! The worker loop: claims jobs up to its concurrency, hands each to the handler of its
//! kind, heartbeats every held lease on its own connection, and interrupts a job whose
//! lease was lost or whose domain row was cancelled. On shutdown it stops claiming, lets
//! running jobs finish within the drain window, then interrupts and releases the rest.
//! Jobs with nothing to commit alongside their ack ack through [`Job::ack`], which
//! gathers concurrent acks into one statement.

use std::collections::{HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{CANCEL_CHANNEL, JOBS_CHANNEL, Lease, Positions, QueuePool};
use crate::store::{self, StoreError};
use crate::telemetry;

/// Executes jobs of one kind. The handler owns the job's domain transitions: it acks or
/// nacks with [`super::complete`] / [`super::retry`] inside its own fenced transaction,
/// or, when the job has no domain change to commit, acks with [`Job::ack`].
pub trait JobHandler: Send + Sync + 'static {
    fn kind(&self) -> &'static str;
    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()>;
}

/// One claimed job, as its handler sees it.
pub struct Job {
    pub lease: Lease,
    /// Fires when the job must stop: cancelled, lease lost, or released at shutdown.
    pub interrupt: CancellationToken,
    released: Arc<AtomicBool>,
    acks: Acks,
}

impl Job {
    /// Acks the job by itself, for work that commits nothing else (a `run` job's ack
    /// commits with the run's terminal state instead). The ack is queued when this is
    /// called; the returned receipt resolves once it committed (or `LeaseLost` when the
    /// lease had moved on), so a handler may return, freeing its slot, before it does.
    /// Acks queued while another batch is in flight share the next statement; each is
    /// still fenced by its own token.
    #[must_use = "the ack is counted as pending (it takes claim room, and shutdown waits for \
                  it) until the receipt is awaited"]
    pub fn ack(&self) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        self.acks.submit(&self.lease)
    }

    /// True when the interruption is a graceful release at shutdown: the handler should
    /// hand the job back (requeue it) rather than abandon it.
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub concurrency: usize,
    /// Jobs claimed ahead of a free slot, leased while they wait (0: claim only for free
    /// slots). Saves claim round trips for short jobs; hoards long ones from other workers.
    pub prefetch: usize,
    pub lease: Duration,
    pub poll_interval: Duration,
    pub drain_timeout: Duration,
    /// Set: claims are fair across workspaces ([`super::fair`]) and no workspace holds more
    /// than this many jobs at once unless an operator set its own limit.
    pub max_per_workspace: Option<u32>,
}

struct InFlight {
    kind: String,
    ref_id: String,
    fencing_token: i64,
    interrupt: CancellationToken,
    released: Arc<AtomicBool>,
}

type Registry = Arc<Mutex<HashMap<i64, InFlight>>>;

/// A claim's leases and the room it was given.
type ClaimResult = Result<(Vec<Lease>, usize), StoreError>;

pub struct Worker {
    pub id: String,
    pool: PgPool,
    /// Claims, heartbeats, batched acks and the snapshot check ([`QueuePool`]).
    queue: QueuePool,
    settings: WorkerSettings,
    handlers: HashMap<&'static str, Arc<dyn JobHandler>>,
}

impl Worker {
    pub fn new(pool: PgPool, settings: WorkerSettings, handlers: Vec<Arc<dyn JobHandler>>) -> Self {
        let id = crate::domain::new_id("wrk");
        let handlers = handlers.into_iter().map(|h| (h.kind(), h)).collect();
        Worker {
            id,
            queue: QueuePool::new(&pool, QUEUE_CONNECTIONS),
            pool,
            settings,
            handlers,
        }
    }

    fn kinds(&self) -> Vec<String> {
        self.handlers.keys().map(|k| k.to_string()).collect()
    }

    /// Runs until `shutdown` fires, then drains.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), StoreError> {
        let kinds = self.kinds();
        store::workers::register(&self.pool, &self.id, &kinds, self.settings.concurrency).await?;
        tracing::info!(worker_id = %self.id, ?kinds, concurrency = self.settings.concurrency, "worker started");
        let registry: Registry = Arc::default();
        let wake = Arc::new(Notify::new());
        // Listen before the first claim, so no enqueue between the two is missed.
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen_all([JOBS_CHANNEL, CANCEL_CHANNEL]).await?;
        let background = CancellationToken::new();
        tokio::spawn(listen(
            listener,
            registry.clone(),
            wake.clone(),
            background.clone(),
        ));
        tokio::spawn(heartbeat(
            self.queue.clone(),
            self.id.clone(),
            self.settings.lease,
            registry.clone(),
            background.clone(),
        ));

        let (requests, pending_acks) = mpsc::unbounded_channel();
        tokio::spawn(batch_acks(
            self.queue.clone(),
            self.id.clone(),
            pending_acks,
        ));
        let acks = Acks {
            pool: self.pool.clone(),
            requests,
            pending: Arc::default(),
            allowance: self.settings.concurrency + self.settings.prefetch,
            wake: wake.clone(),
        };
        let mut tasks = JoinSet::new();
        self.claim_loop(&kinds, &registry, &wake, &acks, &mut tasks, &shutdown)
            .await;
        self.drain(&registry, &mut tasks).await;
        acks.settle(self.settings.drain_timeout).await;
        background.cancel();
        store::workers::deregister(&self.pool, &self.id).await?;
        tracing::info!(worker_id = %self.id, "worker stopped");
        Ok(())
    }

    async fn claim_loop(
        &self,
        kinds: &[String],
        registry: &Registry,
        wake: &Notify,
        acks: &Acks,
        tasks: &mut JoinSet<i64>,
        shutdown: &CancellationToken,
    ) {
        // Leased jobs waiting for a free slot (at most `prefetch`); registered, so their
        // leases are renewed like running ones.
        let mut waiting: VecDeque<Job> = VecDeque::new();
        let claimer = Arc::new(Claimer::default());
        // The claim in flight (at most one): it runs while the loop goes on starting
        // waiting jobs in the slots that free meanwhile.
        let mut claims: JoinSet<ClaimResult> = JoinSet::new();
        let mut want_claim = true;
        let (swept_tx, mut swept) = mpsc::unbounded_channel();
        let stop_sweep = CancellationToken::new();
        tokio::spawn(watch_snapshots(
            self.queue.clone(),
            claimer.shared.clone(),
            stop_sweep.clone(),
        ));
        tokio::spawn(sweep(
            self.queue.clone(),
            self.id.clone(),
            kinds.to_vec(),
            self.settings.clone(),
            claimer.shared.clone(),
            swept_tx,
            stop_sweep.clone(),
        ));
        while !shutdown.is_cancelled() {
            while let Some(done) = tasks.try_join_next() {
                finished(registry, done);
            }
            self.start_waiting(&mut waiting, tasks);
            let room = (self.settings.concurrency + self.settings.prefetch)
                .saturating_sub(tasks.len() + waiting.len() + acks.backlog());
            claimer.shared.room.store(room, Ordering::Relaxed);
            // With a prefetch, claim again once half of it is used: one claim per half
            // buffer rather than one per freed slot.
            if want_claim
                && claims.is_empty()
                && room > 0
                && waiting.len() <= self.settings.prefetch / 2
            {
                want_claim = false;
                claims.spawn(self.claim(&claimer, kinds, room));
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = wake.notified() => want_claim = true,
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    finished(registry, done);
                    want_claim = true;
                }
                Some(claimed) = claims.join_next(), if !claims.is_empty() => {
                    // A full batch suggests more is due: claim again at once.
                    want_claim |= self.take_claimed(claimed, registry, acks, &mut waiting);
                    self.start_waiting(&mut waiting, tasks);
                }
                Some(leases) = swept.recv() => {
                    claimer.advance(&leases);
                    self.hold(leases, registry, acks, &mut waiting);
                }
                _ = tokio::time::sleep(self.settings.poll_interval) => want_claim = true,
            }
        }
        stop_sweep.cancel();
        // What a claim or the sweep took after the loop's last look is handed back with
        // the rest.
        while let Some(claimed) = claims.join_next().await {
            self.take_claimed(claimed, registry, acks, &mut waiting);
        }
        swept.close();
        while let Some(leases) = swept.recv().await {
            self.hold(leases, registry, acks, &mut waiting);
        }
        self.release_waiting(waiting, registry).await;
    }

    /// One claim of up to `room` jobs, as a task of its own.
    fn claim(
        &self,
        claimer: &Arc<Claimer>,
        kinds: &[String],
        room: usize,
    ) -> impl Future<Output = ClaimResult> + Send + 'static {
        let (claimer, pool, owner) = (claimer.clone(), self.queue.clone(), self.id.clone());
        let (kinds, settings) = (kinds.to_vec(), self.settings.clone());
        async move {
            let leases = claimer
                .claim(&pool, &owner, &kinds, room, &settings)
                .await?;
            Ok((leases, room))
        }
    }

    /// Registers what a claim took; true when it filled all the room it was given.
    fn take_claimed(
        &self,
        claimed: Result<ClaimResult, tokio::task::JoinError>,
        registry: &Registry,
        acks: &Acks,
        waiting: &mut VecDeque<Job>,
    ) -> bool {
        match claimed {
            Ok(Ok((leases, room))) => {
                let full = leases.len() >= room;
                self.hold(leases, registry, acks, waiting);
                full
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "claim failed; retrying after the poll interval");
                false
            }
            Err(error) => {
                tracing::error!(%error, "claim task failed");
                false
            }
        }
    }

    /// Registers claimed jobs and queues them for a free slot.
    fn hold(
        &self,
        leases: Vec<Lease>,
        registry: &Registry,
        acks: &Acks,
        waiting: &mut VecDeque<Job>,
    ) {
        waiting.extend(
            leases
                .into_iter()
                .filter_map(|l| self.register(l, registry, acks)),
        );
    }

    /// Records a claimed job as held by this worker; None for a kind with no handler.
    fn register(&self, lease: Lease, registry: &Registry, acks: &Acks) -> Option<Job> {
        if !self.handlers.contains_key(lease.kind.as_str()) {
            tracing::error!(kind = %lease.kind, "claimed a job of a kind with no handler");
            return None;
        }
        let interrupt = CancellationToken::new();
        let released = Arc::new(AtomicBool::new(false));
        registry.lock().unwrap().insert(
            lease.job_id,
            InFlight {
                kind: lease.kind.clone(),
                ref_id: lease.ref_id.clone(),
                fencing_token: lease.fencing_token,
                interrupt: interrupt.clone(),
                released: released.clone(),
            },
        );
        Some(Job {
            lease,
            interrupt,
            released,
            acks: acks.clone(),
        })
    }

    /// Starts waiting jobs while a slot is free.
    fn start_waiting(&self, waiting: &mut VecDeque<Job>, tasks: &mut JoinSet<i64>) {
        while tasks.len() < self.settings.concurrency {
            let Some(job) = waiting.pop_front() else {
                return;
            };
            self.start(job, tasks);
        }
    }

    fn start(&self, job: Job, tasks: &mut JoinSet<i64>) {
        let handler = self.handlers[job.lease.kind.as_str()].clone();
        let job_id = job.lease.job_id;
        let span = claim_span(&job.lease);
        // The handler's span starts inside the claim span, so it joins the enqueuer's trace.
        let run = span.in_scope(|| handler.run(job));
        tasks.spawn(async move {
            if AssertUnwindSafe(run).catch_unwind().await.is_err() {
                // The lease stays until it expires; another worker then takes the job over.
                tracing::error!(job_id, "job handler panicked");
            }
            job_id
        });
    }

    /// Hands back, at shutdown, the prefetched jobs that never started: claimable again at
    /// once, with the attempt given back.
    async fn release_waiting(&self, waiting: VecDeque<Job>, registry: &Registry) {
        for job in waiting {
            registry.lock().unwrap().remove(&job.lease.job_id);
            let released = async {
                let mut conn = self.pool.acquire().await?;
                super::retry(
                    &mut conn,
                    &job.lease,
                    "worker shut down",
                    Duration::ZERO,
                    false,
                )
                .await
            };
            if let Err(error) = released.await {
                // Its lease expires and another worker takes it over.
                tracing::warn!(%error, job_id = job.lease.job_id, "could not hand back a prefetched job");
            }
        }
    }

    async fn drain(&self, registry: &Registry, tasks: &mut JoinSet<i64>) {
        if tasks.is_empty() {
            return;
        }
        tracing::info!(jobs = tasks.len(), timeout = ?self.settings.drain_timeout, "draining running jobs");
        let deadline = tokio::time::Instant::now() + self.settings.drain_timeout;
        while !tasks.is_empty() {
            match tokio::time::timeout_at(deadline, tasks.join_next()).await {
                Ok(Some(done)) => finished(registry, done),
                Ok(None) => break,
                Err(_) => break,
            }
        }
        for job in registry.lock().unwrap().values() {
            job.released.store(true, Ordering::SeqCst);
            job.interrupt.cancel();
        }
        while let Some(done) = tasks.join_next().await {
            finished(registry, done);
        }
    }
}

/// A span per claimed job, child of the span that enqueued it (across processes), and the
/// claim's metrics.
fn claim_span(lease: &Lease) -> tracing::Span {
    let queue_wait = Duration::from_millis(lease.due_ms.max(0) as u64);
    telemetry::metrics::claimed(&lease.kind, queue_wait);
    let span = tracing::info_span!(
        "claim",
        otel.kind = "consumer",
        job.kind = %lease.kind,
        job.id = lease.job_id,
        job.attempt = lease.attempts,
        queue_wait_ms = lease.due_ms,
    );
    telemetry::set_remote_parent(&span, lease.traceparent.as_deref());
    span
}

fn finished(registry: &Registry, done: Result<i64, tokio::task::JoinError>) {
    if let Ok(job_id) = done {
        registry.lock().unwrap().remove(&job_id);
    }
}

/// Wakes the claim loop on new jobs and interrupts jobs whose domain row was withdrawn.
async fn listen(
    mut listener: PgListener,
    registry: Registry,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    loop {
        let notification = tokio::select! {
            _ = stop.cancelled() => return,
            n = listener.recv() => n,
        };
        match notification {
            Ok(n) if n.channel() == JOBS_CHANNEL => wake.notify_one(),
            Ok(n) => {
                if let Some((kind, ref_id)) = n.payload().split_once(':') {
                    for job in registry.lock().unwrap().values() {
                        if job.kind == kind && job.ref_id == ref_id {
                            job.interrupt.cancel();
                        }
                    }
                }
            }
            Err(error) => {
                // PgListener reconnects on the next recv; the poll and heartbeat cover the gap.
                tracing::warn!(%error, "notification listener error");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Connections of a worker's [`QueuePool`]: the claim, the sweep, the heartbeat and the ack
/// batcher each use one at a time.
const QUEUE_CONNECTIONS: u32 = 4;

/// Renews every held lease, and the worker's registry row, every lease/3; a job whose
/// lease did not renew is interrupted.
async fn heartbeat(
    pool: QueuePool,
    owner: String,
    lease: Duration,
    registry: Registry,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let held: Vec<(i64, i64)> = registry
            .lock()
            .unwrap()
            .iter()
            .map(|(id, job)| (*id, job.fencing_token))
            .collect();
        match super::heartbeat(&pool, &owner, &held, lease).await {
            Ok(renewed) => {
                telemetry::metrics::leases_renewed(renewed.len());
                for (job_id, _) in held.iter().filter(|(id, _)| !renewed.contains(id)) {
                    if let Some(job) = registry.lock().unwrap().get(job_id) {
                        tracing::warn!(job_id, "lease lost; interrupting the job");
                        telemetry::metrics::lease_lost(&job.kind);
                        job.interrupt.cancel();
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "lease heartbeat failed"),
        }
    }
}

/// The most acks one statement carries.
const ACK_BATCH: usize = 1_000;

type AckRequest = (i64, i64, oneshot::Sender<Option<bool>>);

/// The way into a worker's ack batcher ([`batch_acks`]).
#[derive(Clone)]
struct Acks {
    pool: PgPool,
    requests: mpsc::UnboundedSender<AckRequest>,
    /// Acks queued and not yet resolved. A handler returns before its ack commits, so
    /// without a bound a worker whose acks are slower than its claims (an old snapshot
    /// held, an overloaded database) would pile up acks, and their unrenewed leases,
    /// without end.
    pending: Arc<AtomicUsize>,
    /// Pending acks beyond this many take up claim room.
    allowance: usize,
    /// Wakes the claim loop when pending acks fall back within the allowance.
    wake: Arc<Notify>,
}

impl Acks {
    /// Waits (at most `timeout`) for the acks still queued at shutdown to commit: a
    /// process that exited with them queued would leave their jobs to run again once
    /// their leases expired.
    async fn settle(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.pending.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// How much claim room pending acks take: what they hold beyond the allowance.
    fn backlog(&self) -> usize {
        self.pending
            .load(Ordering::Relaxed)
            .saturating_sub(self.allowance)
    }
}

impl Acks {
    fn submit(
        &self,
        lease: &Lease,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let queued = self
            .requests
            .send((lease.job_id, lease.fencing_token, reply))
            .is_ok();
        self.pending.fetch_add(1, Ordering::Relaxed);
        let (pool, lease) = (self.pool.clone(), lease.clone());
        let (pending, allowance, wake) = (self.pending.clone(), self.allowance, self.wake.clone());
        async move {
            let acked = async {
                if queued {
                    match answer.await {
                        Ok(Some(true)) => return Ok(()),
                        Ok(Some(false)) => return Err(StoreError::LeaseLost),
                        Ok(None) | Err(_) => {}
                    }
                }
                // The batch failed: ack alone, so this job gets its own answer (or error).
                let mut tx = super::begin_fenced(&pool, &lease).await?;
                super::complete(&mut tx, &lease).await?;
                tx.commit().await?;
                Ok(())
            }
            .await;
            if pending.fetch_sub(1, Ordering::Relaxed) == allowance + 1 {
                wake.notify_one();
            }
            acked
        }
    }
}

/// Acks what the jobs sent, one statement per batch: whatever arrived while the previous
/// statement ran goes in the next, so acks wait for no timer. Ends when every sender is
/// gone (the worker and its last job).
async fn batch_acks(
    pool: QueuePool,
    owner: String,
    mut requests: mpsc::UnboundedReceiver<AckRequest>,
) {
    let mut batch = Vec::with_capacity(ACK_BATCH);
    while requests.recv_many(&mut batch, ACK_BATCH).await > 0 {
        let held: Vec<(i64, i64)> = batch.iter().map(|(id, token, _)| (*id, *token)).collect();
        let acked = match super::complete_many(&pool, &owner, &held).await {
            Ok(ids) => Some(ids.into_iter().collect::<HashSet<i64>>()),
            Err(error) => {
                tracing::warn!(%error, jobs = held.len(), "batched ack failed; acking one by one");
                None
            }
        };
        for (id, _, reply) in batch.drain(..) {
            let _ = reply.send(acked.as_ref().map(|ids| ids.contains(&id)));
        }
    }
}

/// A snapshot held this long means vacuum is leaving dead index entries at the head of the
/// claim order: positioned claims go on. Longer than any transaction Keel itself keeps
/// open (an enqueue that commits late included), shorter than the seconds after which a
/// busy queue's full claims step over thousands of entries.
const OLD_SNAPSHOT: Duration = Duration::from_secs(2);
/// How often a worker looks at the age of the oldest snapshot.
const SNAPSHOT_CHECK: Duration = Duration::from_secs(1);

/// How long the sweep waits between full claims that take `cost`: they run at most
/// 1/[`super::CATCH_ALL_SPACING`] of the time, at least a poll interval and at most
/// [`MAX_SWEEP_PAUSE`] apart.
fn sweep_pause(cost: Duration, poll_interval: Duration) -> Duration {
    super::catch_all_pause(cost)
        .min(MAX_SWEEP_PAUSE)
        .max(poll_interval)
}

/// The longest a job that only a full claim finds (an enqueue that committed late) waits
/// while positioned claims are on.
const MAX_SWEEP_PAUSE: Duration = Duration::from_secs(60);

/// What the claim loop, its sweep and the snapshot watch share.
#[derive(Default)]
struct ClaimState {
    /// How long the last full claim took (µs).
    full_claim_us: AtomicU64,
    /// Whether an old snapshot is held: positioned claims are on.
    old_snapshot: AtomicBool,
    /// Jobs the worker can take now.
    room: AtomicUsize,
}

impl ClaimState {
    fn record(&self, started: Instant) {
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.full_claim_us.store(us, Ordering::Relaxed);
    }

    fn positioned(&self) -> bool {
        self.old_snapshot.load(Ordering::Relaxed)
    }
}

/// Turns positioned claims on while the oldest snapshot is older than [`OLD_SNAPSHOT`]
/// and off once it is not, looking every [`SNAPSHOT_CHECK`], off the claim path. The
/// cause is watched, not a symptom: a claim's latency also grows with the distance to the
/// database, and a worker 1 ms away from it read slow claims as an old snapshot.
async fn watch_snapshots(pool: QueuePool, state: Arc<ClaimState>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SNAPSHOT_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match super::oldest_snapshot(&pool).await {
            Ok(age) => {
                let old = age >= OLD_SNAPSHOT;
                if state.old_snapshot.swap(old, Ordering::Relaxed) != old {
                    tracing::info!(
                        ?age,
                        "oldest snapshot {}; positioned claims {}",
                        if old { "old" } else { "recent" },
                        if old { "on" } else { "off" }
                    );
                }
            }
            Err(error) => tracing::warn!(%error, "could not read the oldest snapshot's age"),
        }
    }
}

/// How the claim loop claims (docs/queue.md, "Old snapshots"). While full claims are
/// no old snapshot is held, each claim is one full claim ([`super::claim`]: due jobs from
/// the head of the index, and expired leases). While one is ([`watch_snapshots`]), the
/// loop claims each kind from where its claims have reached ([`super::claim_from`]) and
/// [`sweep`] runs the full claim, spaced out, off the loop.
#[derive(Default)]
struct Claimer {
    positions: Mutex<HashMap<String, Positions>>,
    shared: Arc<ClaimState>,
}

impl Claimer {
    async fn claim(
        &self,
        pool: &QueuePool,
        owner: &str,
        kinds: &[String],
        room: usize,
        settings: &WorkerSettings,
    ) -> Result<Vec<Lease>, StoreError> {
        if let Some(max) = settings.max_per_workspace {
            return Self::claim_fair(pool, owner, kinds, room, settings.lease, max).await;
        }
        let leases = if self.shared.positioned() {
            self.claim_from(pool, owner, kinds, room, settings).await?
        } else {
            let started = Instant::now();
            let leases = super::claim(pool, owner, kinds, room as i64, settings.lease).await?;
            self.shared.record(started);
            leases
        };
        self.advance(&leases);
        Ok(leases)
    }

    /// Fair claims have no positions to keep: each workspace is read from the head of its
    /// own stretch of the index.
    async fn claim_fair(
        pool: &QueuePool,
        owner: &str,
        kinds: &[String],
        room: usize,
        lease: Duration,
        max: u32,
    ) -> Result<Vec<Lease>, StoreError> {
        kind_by_kind(kinds, room, |kind, limit| {
            super::fair::claim(pool.pool(), owner, kind, limit, lease, max)
        })
        .await
    }

    async fn claim_from(
        &self,
        pool: &QueuePool,
        owner: &str,
        kinds: &[String],
        room: usize,
        settings: &WorkerSettings,
    ) -> Result<Vec<Lease>, StoreError> {
        kind_by_kind(kinds, room, |kind, limit| {
            let (from, slack) = {
                let mut positions = self.positions.lock().unwrap();
                let from = positions.entry(kind.to_string()).or_default();
                let slack = from.slack();
                (from.clone(), slack)
            };
            async move {
                super::claim_from(pool, owner, kind, &from, slack, limit, settings.lease).await
            }
        })
        .await
    }

    /// Moves each kind's positions up to these jobs.
    fn advance(&self, leases: &[Lease]) {
        let mut positions = self.positions.lock().unwrap();
        for lease in leases {
            positions
                .entry(lease.kind.clone())
                .or_default()
                .advance(lease);
        }
    }
}

/// Claims kind by kind, each for what room the kinds before it left, until the room is
/// filled: `claim(kind, limit)` claims up to `limit` jobs of one kind.
async fn kind_by_kind<'k, F, Claim>(
    kinds: &'k [String],
    room: usize,
    mut claim: F,
) -> Result<Vec<Lease>, StoreError>
where
    F: FnMut(&'k str, i64) -> Claim,
    Claim: Future<Output = Result<Vec<Lease>, StoreError>>,
{
    let mut leases = Vec::new();
    for kind in kinds {
        let left = room.saturating_sub(leases.len());
        if left == 0 {
            break;
        }
        leases.extend(claim(kind, left as i64).await?);
    }
    Ok(leases)
}

/// The full claim while an old snapshot is held, off the claim loop so positioned claims
/// go on (a slow full claim in the loop would hold up every pickup behind it), spaced by
/// [`sweep_pause`]. It hands what it claimed to the loop. Idle otherwise (the loop runs
/// full claims itself).
async fn sweep(
    pool: QueuePool,
    owner: String,
    kinds: Vec<String>,
    settings: WorkerSettings,
    state: Arc<ClaimState>,
    found: mpsc::UnboundedSender<Vec<Lease>>,
    stop: CancellationToken,
) {
    loop {
        let cost = Duration::from_micros(state.full_claim_us.load(Ordering::Relaxed));
        let pause = sweep_pause(cost, settings.poll_interval);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        if !state.positioned() {
            continue;
        }
        // Even a saturated worker sweeps: what only a full claim finds would otherwise
        // wait for a free slot at a sweep, which positioned claims may never leave. Jobs
        // swept beyond the free slots wait, leased, for one (as prefetched jobs do).
        let room = state.room.load(Ordering::Relaxed).max(settings.concurrency);
        let started = Instant::now();
        match super::claim(&pool, &owner, &kinds, room as i64, settings.lease).await {
            Ok(leases) => {
                state.record(started);
                if !leases.is_empty() && found.send(leases).is_err() {
                    return;
                }
            }
            Err(error) => tracing::warn!(%error, "sweep claim failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_are_spaced_by_their_cost_within_bounds() {
        let poll = Duration::from_millis(100);
        assert_eq!(sweep_pause(Duration::from_micros(10), poll), poll);
        assert_eq!(
            sweep_pause(Duration::from_millis(50), poll),
            Duration::from_secs(1)
        );
        // A full claim that took 10 s would be spaced 200 s apart without the bound.
        assert_eq!(sweep_pause(Duration::from_secs(10), poll), MAX_SWEEP_PAUSE);
        assert_eq!(
            sweep_pause(Duration::from_millis(500), poll),
            Duration::from_secs(10)
        );
    }
}
