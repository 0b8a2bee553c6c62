//! The worker and its claim loop: claims jobs up to its concurrency (how: `claims.rs`),
//! hands each to the handler of its kind, and on shutdown stops claiming, lets running
//! jobs finish within the drain window, then interrupts and releases the rest. Beside the
//! loop run the heartbeat (`heartbeat.rs`), the self-fence that stops a job once its
//! lease's local deadline passes (`deadline.rs`) and the listener (`listen.rs`: new jobs,
//! withdrawn ones); `registry.rs` keeps the worker's row in `workers`; `window.rs` sizes
//! how many jobs it holds.

mod claims;
mod deadline;
mod heartbeat;
mod listen;
mod registry;
mod window;

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::queue::snapshot::{Claiming, HeldSnapshot, Swept};
use crate::queue::worker::window::Window;
use crate::queue::{Lease, QueuePool};
use crate::queue::{QueueError, reach};
use crate::telemetry;
use claims::Claimer;
pub use deadline::{DeadlineNear, LeaseDeadline, LeaseTiming};

/// Executes jobs of one kind. The handler owns the job's domain transitions: it ends each
/// attempt with a [`crate::queue::Disposition`], settled with [`crate::queue::settle`]
/// inside its own fenced transaction.
pub trait JobHandler: Send + Sync + 'static {
    fn kind(&self) -> &'static str;
    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()>;
}

/// One claimed job, as its handler sees it.
pub struct Job {
    pub lease: Lease,
    /// Fires when the job must stop: cancelled, lease lost, its local deadline passed, or
    /// released at shutdown.
    pub interrupt: CancellationToken,
    /// The lease's local deadline: checked before each external call that cannot be undone.
    pub(crate) deadline: LeaseDeadline,
    released: Arc<AtomicBool>,
}

impl Job {
    /// True when the interruption is a graceful release at shutdown: the handler should
    /// hand the job back (requeue it) rather than abandon it.
    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub concurrency: usize,
    /// Jobs claimed ahead of a free slot, leased while they wait (0: claim only for free
    /// slots). Saves claim round trips for short jobs; hoards long ones from other workers.
    pub prefetch: usize,
    /// The lease, its local deadline's margin and the heartbeat's timeout.
    pub timing: LeaseTiming,
    pub poll_interval: Duration,
    pub drain_timeout: Duration,
    /// Set: claims are fair across workspaces ([`crate::queue::fair`]) and no workspace holds more
    /// than this many jobs at once unless an operator set its own limit.
    pub max_per_workspace: Option<u32>,
}

struct InFlight {
    kind: String,
    ref_id: String,
    fencing_token: i64,
    interrupt: CancellationToken,
    released: Arc<AtomicBool>,
    /// The lease's local deadline, moved by each confirmed renewal.
    deadline: watch::Sender<Instant>,
    /// Stopped by its deadline: renewed no more.
    past_deadline: bool,
}

type Registry = Arc<Mutex<HashMap<i64, InFlight>>>;

/// A claim's leases, the room it was given and when it was sent (the leases' local
/// deadlines count from then).
type ClaimResult = Result<(Vec<Lease>, usize, Instant), QueueError>;

pub struct Worker {
    pub(crate) id: String,
    pool: PgPool,
    /// Claims, the snapshot check and the hand-back at shutdown ([`QueuePool`]).
    queue: QueuePool,
    settings: WorkerSettings,
    handlers: HashMap<&'static str, Arc<dyn JobHandler>>,
    /// Asks the heartbeat for a renewal now (a job's deadline is near).
    renew: Arc<Notify>,
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
            renew: Arc::new(Notify::new()),
        }
    }

    fn kinds(&self) -> Vec<String> {
        self.handlers.keys().map(|k| k.to_string()).collect()
    }

    /// Runs until `shutdown` fires, then drains.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), QueueError> {
        let kinds = self.kinds();
        // Listening before the first claim, so no enqueue between the two is missed.
        let listener = reach::retry_while_unreachable(
            "worker start",
            reach::STARTUP_PATIENCE,
            &shutdown,
            QueueError::is_unreachable,
            || self.start_up(&kinds),
        )
        .await?;
        tracing::info!(
            worker_id = %self.id,
            ?kinds,
            concurrency = self.settings.concurrency,
            max_per_workspace = ?self.settings.max_per_workspace,
            "worker started"
        );
        let registry: Registry = Arc::default();
        let wake = Arc::new(Notify::new());
        let background = CancellationToken::new();
        tokio::spawn(listen::listen(
            listener,
            registry.clone(),
            wake.clone(),
            background.clone(),
        ));
        tokio::spawn(heartbeat::heartbeat(
            self.queue.clone(),
            self.id.clone(),
            self.settings.timing,
            registry.clone(),
            self.renew.clone(),
            background.clone(),
        ));
        // Stops each job at its deadline whatever the database does; it wakes at least
        // every quarter margin to see the deadlines of jobs claimed meanwhile.
        tokio::spawn(deadline::self_fence(
            registry.clone(),
            self.settings.timing.margin / 4,
            background.clone(),
        ));

        let mut tasks = JoinSet::new();
        self.claim_loop(&kinds, &registry, &wake, &mut tasks, &shutdown)
            .await;
        self.drain(&registry, &mut tasks).await;
        background.cancel();
        registry::deregister(&self.pool, &self.id).await?;
        tracing::info!(worker_id = %self.id, "worker stopped");
        Ok(())
    }

    /// Registers the worker, listens and opens the connections of the first claim and of
    /// the snapshot watch's first look (both sent at once), side by side: each costs round
    /// trips, and a database far away made their sum most of the time before the first
    /// claim. Safe to repeat.
    async fn start_up(&self, kinds: &[String]) -> Result<PgListener, QueueError> {
        let (registered, listener, opened) = tokio::join!(
            registry::register(&self.pool, &self.id, kinds, self.settings.concurrency),
            listen::subscribe(&self.pool),
            self.queue.open(2),
        );
        registered?;
        opened?;
        listener
    }

    async fn claim_loop(
        &self,
        kinds: &[String],
        registry: &Registry,
        wake: &Notify,
        tasks: &mut JoinSet<i64>,
        shutdown: &CancellationToken,
    ) {
        // Leased jobs waiting for a free slot (at most `prefetch`); registered, so their
        // leases are renewed like running ones.
        let mut waiting: VecDeque<Job> = VecDeque::new();
        // The claim in flight (at most one): it runs while the loop goes on starting
        // waiting jobs in the slots that free meanwhile.
        let mut claims: JoinSet<ClaimResult> = JoinSet::new();
        let mut want_claim = true;
        let mut window = Window::new(self.settings.concurrency, self.settings.prefetch);
        // Whether a slot sat idle with no job waiting while the claim in flight travelled:
        // then the claim round trip, not the jobs, is what the worker waits on.
        let mut starved = false;
        let stop_sweep = CancellationToken::new();
        let (claimer, mut swept) = self.claimer(kinds, &stop_sweep);
        while !shutdown.is_cancelled() {
            while let Some(done) = tasks.try_join_next() {
                finished(registry, done);
            }
            self.start_waiting(&mut waiting, tasks);
            starved |= tasks.len() < self.settings.concurrency && waiting.is_empty();
            let room = window.size().saturating_sub(tasks.len() + waiting.len());
            claimer.room(room);
            // One claim in flight, sized to all the room there is. With a prefetch, a
            // claim waits for a quarter of it to be free, so a worker whose jobs are the
            // limit claims in batches rather than one per freed slot. What bounds a
            // worker far from its database is the window itself, jobs held per claim
            // round trip, which is why it widens while claims starve the slots.
            if want_claim && claims.is_empty() && room > window.prefetch() / 4 {
                want_claim = false;
                starved = false;
                claims.spawn(Self::claim(&claimer, room));
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = wake.notified() => want_claim = true,
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    finished(registry, done);
                    want_claim = true;
                }
                Some(claimed) = claims.join_next(), if !claims.is_empty() => {
                    starved |= tasks.len() < self.settings.concurrency && waiting.is_empty();
                    // A full batch suggests more is due: claim again at once.
                    let full = self.take_claimed(claimed, registry, &mut waiting);
                    window.claimed(full, starved);
                    want_claim |= full;
                    self.start_waiting(&mut waiting, tasks);
                }
                Some((leases, sent)) = swept.recv() => {
                    claimer.advance(&leases);
                    self.hold(leases, sent, registry, &mut waiting);
                }
                _ = tokio::time::sleep(self.settings.poll_interval) => want_claim = true,
            }
        }
        stop_sweep.cancel();
        // What a claim or the sweep took after the loop's last look is handed back with
        // the rest.
        while let Some(claimed) = claims.join_next().await {
            self.take_claimed(claimed, registry, &mut waiting);
        }
        swept.close();
        while let Some((leases, sent)) = swept.recv().await {
            self.hold(leases, sent, registry, &mut waiting);
        }
        self.release_waiting(waiting, registry).await;
    }

    /// What claims this worker's `kinds`, and the sweep of a held snapshot beside it (until
    /// `stop_sweep`), whose leases come through the receiver.
    fn claimer(&self, kinds: &[String], stop_sweep: &CancellationToken) -> (Arc<Claimer>, Swept) {
        let claiming = Claiming {
            pool: self.queue.clone(),
            owner: self.id.clone(),
            kinds: kinds.to_vec(),
            lease: self.settings.timing.lease,
            poll_interval: self.settings.poll_interval,
            concurrency: self.settings.concurrency,
        };
        let (snapshot, swept) = HeldSnapshot::start(claiming.clone(), stop_sweep.clone());
        let max_per_workspace = self.settings.max_per_workspace;
        let claimer = Arc::new(Claimer::new(claiming, max_per_workspace, snapshot));
        (claimer, swept)
    }

    /// One claim of up to `room` jobs, as a task of its own.
    fn claim(
        claimer: &Arc<Claimer>,
        room: usize,
    ) -> impl Future<Output = ClaimResult> + Send + 'static {
        let claimer = claimer.clone();
        async move {
            let started = Instant::now();
            let leases = claimer.claim(room).await?;
            // What sizes a claim and how long it travels: the numbers that say whether
            // the buffer covers a claim's round trip (docs/queue.md, "Settling and
            // prefetch").
            tracing::debug!(jobs = leases.len(), room, elapsed = ?started.elapsed(), "claimed");
            Ok((leases, room, started))
        }
    }

    /// Registers what a claim took; true when it filled all the room it was given.
    fn take_claimed(
        &self,
        claimed: Result<ClaimResult, tokio::task::JoinError>,
        registry: &Registry,
        waiting: &mut VecDeque<Job>,
    ) -> bool {
        match claimed {
            Ok(Ok((leases, room, sent))) => {
                let full = leases.len() >= room;
                self.hold(leases, sent, registry, waiting);
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

    /// Registers jobs claimed by a statement sent at `sent` and queues them for a free slot.
    fn hold(
        &self,
        leases: Vec<Lease>,
        sent: Instant,
        registry: &Registry,
        waiting: &mut VecDeque<Job>,
    ) {
        waiting.extend(
            leases
                .into_iter()
                .filter_map(|l| self.register(l, sent, registry)),
        );
    }

    /// Records a claimed job as held by this worker; None for a kind with no handler.
    fn register(&self, lease: Lease, sent: Instant, registry: &Registry) -> Option<Job> {
        if !self.handlers.contains_key(lease.kind.as_str()) {
            tracing::error!(kind = %lease.kind, "claimed a job of a kind with no handler");
            return None;
        }
        let interrupt = CancellationToken::new();
        let released = Arc::new(AtomicBool::new(false));
        let timing = &self.settings.timing;
        let (deadline, watched) = watch::channel(timing.deadline(sent));
        registry.lock().unwrap().insert(
            lease.job_id,
            InFlight {
                kind: lease.kind.clone(),
                ref_id: lease.ref_id.clone(),
                fencing_token: lease.fencing_token,
                interrupt: interrupt.clone(),
                released: released.clone(),
                deadline,
                past_deadline: false,
            },
        );
        Some(Job {
            lease,
            interrupt,
            deadline: LeaseDeadline::new(watched, self.renew.clone(), timing),
            released,
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
    /// once, with the attempt given back. One at a time, each by its own statement.
    async fn release_waiting(&self, waiting: VecDeque<Job>, registry: &Registry) {
        for job in waiting {
            registry.lock().unwrap().remove(&job.lease.job_id);
            let released = async {
                let mut conn = self.queue.0.acquire().await?;
                crate::queue::settle(&mut conn, &job.lease, crate::queue::Disposition::Release)
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

/// Connections of a worker's [`QueuePool`]: the claim, the sweep and the snapshot watch
/// each use one at a time, and the hand-back at shutdown one once the claims are done (the
/// heartbeat opens its own with the same options).
const QUEUE_CONNECTIONS: u32 = 4;
