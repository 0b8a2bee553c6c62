//! The worker loop: claims jobs up to its concurrency, hands each to the handler of its
//! kind, heartbeats every held lease on its own connection, and interrupts a job whose
//! lease was lost or whose domain row was cancelled. On shutdown it stops claiming, lets
//! running jobs finish within the drain window, then interrupts and releases the rest.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{CANCEL_CHANNEL, JOBS_CHANNEL, Lease};
use crate::store::{self, StoreError};
use crate::telemetry;

/// Executes jobs of one kind. The handler owns the job's domain transitions: it acks or
/// nacks with [`super::complete`] / [`super::retry`] inside its own fenced transaction.
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
}

impl Job {
    /// True when the interruption is a graceful release at shutdown: the handler should
    /// hand the job back (requeue it) rather than abandon it.
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub concurrency: usize,
    pub lease: Duration,
    pub poll_interval: Duration,
    pub drain_timeout: Duration,
}

struct InFlight {
    kind: String,
    ref_id: String,
    fencing_token: i64,
    interrupt: CancellationToken,
    released: Arc<AtomicBool>,
}

type Registry = Arc<Mutex<HashMap<i64, InFlight>>>;

pub struct Worker {
    pub id: String,
    pool: PgPool,
    settings: WorkerSettings,
    handlers: HashMap<&'static str, Arc<dyn JobHandler>>,
}

impl Worker {
    pub fn new(pool: PgPool, settings: WorkerSettings, handlers: Vec<Arc<dyn JobHandler>>) -> Self {
        let id = crate::domain::new_id("wrk");
        let handlers = handlers.into_iter().map(|h| (h.kind(), h)).collect();
        Worker {
            id,
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
            self.pool.clone(),
            self.id.clone(),
            self.settings.lease,
            registry.clone(),
            background.clone(),
        ));

        let mut tasks = JoinSet::new();
        self.claim_loop(&kinds, &registry, &wake, &mut tasks, &shutdown)
            .await;
        self.drain(&registry, &mut tasks).await;
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
        tasks: &mut JoinSet<i64>,
        shutdown: &CancellationToken,
    ) {
        while !shutdown.is_cancelled() {
            let free = self.settings.concurrency.saturating_sub(tasks.len());
            if free > 0 {
                match super::claim(
                    &self.pool,
                    &self.id,
                    kinds,
                    free as i64,
                    self.settings.lease,
                )
                .await
                {
                    Ok(leases) => leases
                        .into_iter()
                        .for_each(|lease| self.start(lease, registry, tasks)),
                    Err(error) => {
                        tracing::warn!(%error, "claim failed; retrying after the poll interval")
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = wake.notified() => {}
                Some(done) = tasks.join_next(), if !tasks.is_empty() => finished(registry, done),
                _ = tokio::time::sleep(self.settings.poll_interval) => {}
            }
        }
    }

    fn start(&self, lease: Lease, registry: &Registry, tasks: &mut JoinSet<i64>) {
        let Some(handler) = self.handlers.get(lease.kind.as_str()).cloned() else {
            tracing::error!(kind = %lease.kind, "claimed a job of a kind with no handler");
            return;
        };
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
        let job_id = lease.job_id;
        let span = claim_span(&lease);
        let job = Job {
            lease,
            interrupt,
            released,
        };
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

/// Renews every held lease every lease/3; a job whose lease did not renew is interrupted.
async fn heartbeat(
    pool: PgPool,
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
        if let Err(error) = store::workers::touch(&pool, &owner).await {
            tracing::warn!(%error, "worker registry heartbeat failed");
        }
        if held.is_empty() {
            continue;
        }
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
