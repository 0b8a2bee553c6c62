//! How [`crate::queue::worker::Job::ack`] acks a job with no domain change to commit alongside: alone in
//! its own fenced transaction, or, in a worker one of whose kinds asked for it
//! ([`crate::queue::worker::JobHandler::batches_acks`]), through the ack batcher, where concurrent acks
//! share one statement, each fenced by its own token.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use sqlx::PgPool;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::queue::QueueError;
use crate::queue::{Lease, QueuePool};

/// The most acks one statement carries.
const ACK_BATCH: usize = 1_000;

type AckRequest = (i64, i64, oneshot::Sender<Option<bool>>);

/// The way a worker's jobs ack: into its ack batcher ([`batch_acks`]) when it runs one.
#[derive(Clone)]
pub(super) struct Acks {
    pool: PgPool,
    /// None: the worker runs no batcher, each ack commits alone.
    requests: Option<mpsc::UnboundedSender<AckRequest>>,
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
    /// Each ack alone, on `pool`, when it is awaited: no batcher task, no connection of
    /// its own, nothing pending outside the handler (the production kinds' workers).
    pub(super) fn alone(pool: &PgPool, wake: Arc<Notify>) -> Acks {
        Acks {
            pool: pool.clone(),
            requests: None,
            pending: Arc::default(),
            allowance: 0,
            wake,
        }
    }

    /// Starts the batcher of `owner`'s acks. Pending acks beyond `allowance` take claim
    /// room; `wake` is told when they fall back within it. A batch that fails falls back
    /// to one fenced ack per job, on `pool`.
    pub(super) fn batched(
        pool: &PgPool,
        queue: &QueuePool,
        owner: &str,
        allowance: usize,
        wake: Arc<Notify>,
    ) -> Acks {
        let (requests, pending_acks) = mpsc::unbounded_channel();
        tokio::spawn(batch_acks(queue.clone(), owner.to_string(), pending_acks));
        Acks {
            pool: pool.clone(),
            requests: Some(requests),
            pending: Arc::default(),
            allowance,
            wake,
        }
    }

    /// Waits (at most `timeout`) for the acks still queued at shutdown to commit: a
    /// process that exited with them queued would leave their jobs to run again once
    /// their leases expired.
    pub(super) async fn settle(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.pending.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// How much claim room pending acks take: what they hold beyond the allowance.
    pub(super) fn backlog(&self) -> usize {
        self.pending
            .load(Ordering::Relaxed)
            .saturating_sub(self.allowance)
    }
}

impl Acks {
    pub(super) fn submit(
        &self,
        lease: &Lease,
    ) -> impl Future<Output = Result<(), QueueError>> + Send + 'static {
        let (pool, lease) = (self.pool.clone(), lease.clone());
        let Some(requests) = &self.requests else {
            return async move { ack_alone(&pool, &lease).await }.boxed();
        };
        let (reply, answer) = oneshot::channel();
        let queued = requests
            .send((lease.job_id, lease.fencing_token, reply))
            .is_ok();
        self.pending.fetch_add(1, Ordering::Relaxed);
        let (pending, allowance, wake) = (self.pending.clone(), self.allowance, self.wake.clone());
        async move {
            let acked = async {
                if queued {
                    match answer.await {
                        Ok(Some(true)) => return Ok(()),
                        Ok(Some(false)) => return Err(QueueError::LeaseLost),
                        Ok(None) | Err(_) => {}
                    }
                }
                // The batch failed: ack alone, so this job gets its own answer (or error).
                ack_alone(&pool, &lease).await
            }
            .await;
            if pending.fetch_sub(1, Ordering::Relaxed) == allowance + 1 {
                wake.notify_one();
            }
            acked
        }
        .boxed()
    }
}

/// One job's ack in its own fenced transaction.
async fn ack_alone(pool: &PgPool, lease: &Lease) -> Result<(), QueueError> {
    let mut tx = crate::queue::begin_fenced(pool, lease).await?;
    crate::queue::complete(&mut tx, lease).await?;
    tx.commit().await?;
    Ok(())
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
        let started = Instant::now();
        let acked = match crate::queue::complete_many(&pool, &owner, &held).await {
            Ok(ids) => {
                tracing::debug!(jobs = held.len(), elapsed = ?started.elapsed(), "acked a batch");
                Some(ids.into_iter().collect::<HashSet<i64>>())
            }
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
