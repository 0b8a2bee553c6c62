//! The worker's settler: how [`super::Job::settle`] ends the attempt of a job with nothing
//! else to commit (a background poll's next pass, a job handed back at shutdown, the
//! bench's no-op). Settles queued while a statement is in flight share the next one
//! ([`crate::queue::settle_many`]), each fenced by its own token, so they wait for no
//! timer.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::queue::{Disposition, Lease, QueueError, QueuePool, Settlement, settle_many};

/// The most settles one statement carries.
const BATCH: usize = 1_000;

/// A settle and where its answer goes: Some(true) settled, Some(false) the lease was lost,
/// None the statement failed (the settle is tried again alone).
type Request = (Settlement, oneshot::Sender<Option<bool>>);

/// The way a worker's jobs settle by themselves.
#[derive(Clone)]
pub(super) struct Settler {
    pool: QueuePool,
    owner: String,
    requests: mpsc::UnboundedSender<Request>,
    /// Settles queued and not yet answered. A handler returns before its settle commits,
    /// so without a bound a worker whose settles are slower than its claims (an old
    /// snapshot held, an overloaded database) would pile up settles, and their unrenewed
    /// leases, without end.
    pending: Arc<AtomicUsize>,
    /// Pending settles beyond this many take up claim room.
    allowance: usize,
    /// Wakes the claim loop when pending settles fall back within the allowance.
    wake: Arc<Notify>,
}

impl Settler {
    /// Starts the settler of `owner`'s jobs, on `pool`. Pending settles beyond `allowance`
    /// take claim room; `wake` is told when they fall back within it.
    pub(super) fn start(
        pool: &QueuePool,
        owner: &str,
        allowance: usize,
        wake: Arc<Notify>,
    ) -> Settler {
        let (requests, queued) = mpsc::unbounded_channel();
        tokio::spawn(settle_batches(pool.clone(), owner.to_string(), queued));
        Settler {
            pool: pool.clone(),
            owner: owner.to_string(),
            requests,
            pending: Arc::default(),
            allowance,
            wake,
        }
    }

    /// Waits (at most `timeout`) for the settles still queued at shutdown to commit: a
    /// process that exited with them queued would leave their jobs to run again once their
    /// leases expired.
    pub(super) async fn drain(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.pending.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// How much claim room pending settles take: what they hold beyond the allowance.
    pub(super) fn backlog(&self) -> usize {
        self.pending
            .load(Ordering::Relaxed)
            .saturating_sub(self.allowance)
    }

    /// Queues the settle now; the receipt resolves once it committed (or `LeaseLost`).
    pub(super) fn submit(
        &self,
        lease: &Lease,
        disposition: Disposition,
    ) -> impl Future<Output = Result<(), QueueError>> + Send + 'static {
        let settlement = Settlement::of(lease, disposition);
        let (reply, answer) = oneshot::channel();
        let queued = self.requests.send((settlement.clone(), reply)).is_ok();
        self.pending.fetch_add(1, Ordering::Relaxed);
        let (pool, owner) = (self.pool.clone(), self.owner.clone());
        let (pending, allowance, wake) = (self.pending.clone(), self.allowance, self.wake.clone());
        async move {
            let answered = if queued {
                answer.await.ok().flatten()
            } else {
                None
            };
            let settled = match answered {
                Some(settled) => Ok(settled),
                // The batch failed: alone, so this job gets its own answer (or error).
                None => settle_many(&pool, &owner, std::slice::from_ref(&settlement))
                    .await
                    .map(|ids| !ids.is_empty()),
            };
            if pending.fetch_sub(1, Ordering::Relaxed) == allowance + 1 {
                wake.notify_one();
            }
            match settled? {
                true => Ok(()),
                false => Err(QueueError::LeaseLost),
            }
        }
        .boxed()
    }
}

/// Settles what the jobs sent, one statement per batch: whatever arrived while the
/// previous statement ran goes in the next. Ends when every sender is gone (the worker and
/// its last job).
async fn settle_batches(
    pool: QueuePool,
    owner: String,
    mut queued: mpsc::UnboundedReceiver<Request>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while queued.recv_many(&mut batch, BATCH).await > 0 {
        let settlements: Vec<Settlement> = batch.iter().map(|(s, _)| s.clone()).collect();
        let started = Instant::now();
        let settled = match settle_many(&pool, &owner, &settlements).await {
            Ok(ids) => {
                tracing::debug!(jobs = settlements.len(), elapsed = ?started.elapsed(), "settled a batch");
                Some(ids.into_iter().collect::<HashSet<i64>>())
            }
            Err(error) => {
                tracing::warn!(%error, jobs = settlements.len(), "settling a batch failed; settling one by one");
                None
            }
        };
        for (settlement, reply) in batch.drain(..) {
            let _ = reply.send(settled.as_ref().map(|ids| ids.contains(&settlement.job_id)));
        }
    }
}
