//! One attempt of a job that stands for a domain row (a run, a media job): the skeleton
//! both kinds share. Each step is one transaction fenced by the job's lease, with one
//! events append: begin (take over from a lost worker, give up past the attempts, or mark
//! the row running), then exactly one of finish (terminal state and ack), retry (back to
//! `queued` with a delay), hand back (at shutdown, without penalty) or, when interrupted,
//! nothing but the ack a cancel may have left to this worker.

pub(crate) mod fence;
mod observe;

pub(crate) use observe::observe;

use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use crate::attempt::fence::DomainRow;
use crate::db::StoreError;
use crate::domain::{Actor, Scope};
use crate::events;
use crate::events::NewEvent;
use crate::queue::worker::Job;
use crate::queue::{self, Lease};
use crate::telemetry::metrics;

/// What a domain row does at each step of an attempt. Every method writes in the caller's
/// transaction and returns the events for the caller to append, last.
pub(crate) trait Attempted: DomainRow + Sync {
    /// How an attempt that ran to its end leaves the row.
    type Ending: Send + Sync;
    /// Why an attempt asks to run again later.
    type Retry: Send + Sync;

    /// Whether a worker is (or was, before it was lost) running the row.
    fn is_running(&self) -> bool;
    /// The ending of an attempt that used up its job's attempts (after `retry`, if any).
    fn gave_up(error: String, retry: Option<&Self::Retry>) -> Self::Ending;
    /// The job duration metric's label for an ending.
    fn label(ending: &Self::Ending) -> &'static str;
    fn retry_error(retry: &Self::Retry) -> &str;
    /// The delay before the next attempt; None: the queue's backoff.
    fn retry_delay(retry: &Self::Retry) -> Option<Duration>;

    /// Puts the row of a worker that is gone back to `queued`; returns it.
    fn requeue_lost<'r>(
        &'r self,
        conn: &mut PgConnection,
        scope: &Scope,
        reason: &'static str,
        actor: &Actor,
    ) -> impl Future<Output = Result<(Self, Vec<NewEvent<'r>>), StoreError>> + Send;
    /// Marks the row running for this attempt; returns it.
    fn start<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
    ) -> impl Future<Output = Result<(Self, NewEvent<'r>), StoreError>> + Send;
    /// Moves the row to its terminal state (what the ending still carries is written too).
    fn end<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        ending: &'r mut Self::Ending,
    ) -> impl Future<Output = Result<Vec<NewEvent<'r>>, StoreError>> + Send;
    /// Puts the row back to `queued` for a retry after `delay`.
    fn requeue<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        retry: &'r Self::Retry,
        delay: Duration,
    ) -> impl Future<Output = Result<NewEvent<'r>, StoreError>> + Send;
}

/// How an attempt's executor left it.
pub(crate) enum Verdict<R: Attempted> {
    Ended(R::Ending),
    Retry(R::Retry),
    /// Cancelled, lease lost, or released at shutdown: see [`conclude`].
    Interrupted,
}

/// Starts an attempt. A row still running was held by a worker that lost its lease: it
/// goes back to `queued` first, so the trail shows the takeover. Returns None when there
/// is nothing to run (the row already ended, or the job used up its attempts).
pub(crate) async fn begin<R: Attempted>(
    pool: &PgPool,
    lease: &Lease,
) -> Result<Option<R>, StoreError> {
    let Some((mut tx, row)) = fence::lock_unless_ended::<R>(pool, lease).await? else {
        return Ok(None);
    };
    let (scope, actor) = (lease.scope(), worker(lease));
    let reclaimed = row.is_running();
    let queued: R;
    let (current, mut events) = if reclaimed {
        let (requeued, events) = row
            .requeue_lost(&mut tx, &scope, "worker_lease_expired", &actor)
            .await?;
        queued = requeued;
        (&queued, events)
    } else {
        (&row, Vec::new())
    };
    if lease.attempts > lease.max_attempts {
        let error = format!("gave up after {} attempts", lease.max_attempts);
        let mut ending = R::gave_up(error, None);
        events.extend(current.end(&mut tx, lease, &mut ending).await?);
        queue::complete(&mut tx, lease).await?;
        events::append(&mut tx, &scope, &events).await?;
        tx.commit().await?;
        count_reclaim(reclaimed, lease);
        return Ok(None);
    }
    let (started, event) = current.start(&mut tx, lease).await?;
    events.push(event);
    events::append(&mut tx, &scope, &events).await?;
    tx.commit().await?;
    count_reclaim(reclaimed, lease);
    Ok(Some(started))
}

/// Ends the attempt as the executor left it; returns the job metric's label. `row` is
/// the row [`begin`] marked running: while the lease holds, nothing else changes it.
pub(crate) async fn conclude<R: Attempted>(
    pool: &PgPool,
    job: &Job,
    row: &R,
    verdict: Verdict<R>,
) -> Result<&'static str, StoreError> {
    let lease = &job.lease;
    match verdict {
        Verdict::Ended(mut ending) => {
            let label = R::label(&ending);
            finish_while_leased(pool, job, row, &mut ending).await?;
            Ok(label)
        }
        Verdict::Retry(retry) => {
            nack(pool, lease, row, retry).await?;
            Ok("retried")
        }
        Verdict::Interrupted if job.is_released() => {
            hand_back(pool, lease, row).await?;
            Ok("released")
        }
        Verdict::Interrupted => {
            tracing::info!("attempt interrupted (cancelled or lease lost); writing nothing more");
            // A cancel that found the job row locked left its ack to this worker.
            match fence::lock_unless_ended::<R>(pool, lease).await {
                Ok(_) | Err(StoreError::LeaseLost) => Ok("interrupted"),
                Err(error) => Err(error),
            }
        }
    }
}

/// How long [`finish_while_leased`] waits before it tries again on a fresh connection.
const REFINISH_PAUSE: Duration = Duration::from_millis(200);

/// [`finish`], tried again while the database cannot be reached (a failover, a dropped
/// connection) and the lease's local deadline is a heartbeat ahead: the attempt's work is
/// done and its effects happened; given up here, the job would run again, effects and all,
/// once its lease expired. A try whose commit did go through leaves the next one fenced
/// off (the job is acked): nothing is written twice.
async fn finish_while_leased<R: Attempted>(
    pool: &PgPool,
    job: &Job,
    row: &R,
    ending: &mut R::Ending,
) -> Result<(), StoreError> {
    loop {
        match finish(pool, &job.lease, row, ending).await {
            Err(error) if error.is_unreachable() && job.deadline.ensure_ahead().await.is_ok() => {
                tracing::warn!(%error, "could not write the attempt's end; trying again");
                tokio::time::sleep(REFINISH_PAUSE).await;
            }
            done => return done,
        }
    }
}

/// The terminal state, its events and the ack, in one transaction.
pub(crate) async fn finish<R: Attempted>(
    pool: &PgPool,
    lease: &Lease,
    row: &R,
    ending: &mut R::Ending,
) -> Result<(), StoreError> {
    let mut tx = queue::begin_fenced(pool, lease).await?;
    let events = row.end(&mut tx, lease, ending).await?;
    queue::complete(&mut tx, lease).await?;
    events::append(&mut tx, &lease.scope(), &events).await?;
    tx.commit().await?;
    Ok(())
}

/// The runtime or the vendor failed under the attempt: retry after a delay, or give up at
/// the limit.
async fn nack<R: Attempted>(
    pool: &PgPool,
    lease: &Lease,
    row: &R,
    retry: R::Retry,
) -> Result<(), StoreError> {
    if lease.attempts >= lease.max_attempts {
        let error = format!(
            "gave up after {} attempts: {}",
            lease.attempts,
            R::retry_error(&retry)
        );
        return finish(pool, lease, row, &mut R::gave_up(error, Some(&retry))).await;
    }
    let mut tx = queue::begin_fenced(pool, lease).await?;
    let delay = R::retry_delay(&retry).unwrap_or_else(|| queue::backoff(lease.attempts));
    let event = row.requeue(&mut tx, lease, &retry, delay).await?;
    queue::retry(&mut tx, lease, R::retry_error(&retry), delay, true).await?;
    events::append(&mut tx, &lease.scope(), &[event]).await?;
    tx.commit().await?;
    Ok(())
}

/// Gives the job back at shutdown so another worker takes it at once, without penalty.
async fn hand_back<R: Attempted>(pool: &PgPool, lease: &Lease, row: &R) -> Result<(), StoreError> {
    let mut tx = queue::begin_fenced(pool, lease).await?;
    queue::retry(&mut tx, lease, "worker shut down", Duration::ZERO, false).await?;
    let (scope, actor) = (lease.scope(), worker(lease));
    disconnect(&mut tx, &scope, row, "worker_shutdown", &actor).await?;
    tx.commit().await?;
    Ok(())
}

/// Puts the row of a worker that is gone back to `queued`, with its events.
pub(crate) async fn disconnect<R: Attempted>(
    conn: &mut PgConnection,
    scope: &Scope,
    row: &R,
    reason: &'static str,
    actor: &Actor,
) -> Result<(), StoreError> {
    let (_, events) = row.requeue_lost(conn, scope, reason, actor).await?;
    events::append(conn, scope, &events).await
}

/// Counts a takeover once it is committed.
fn count_reclaim(reclaimed: bool, lease: &Lease) {
    if reclaimed {
        metrics::reclaimed(&lease.kind);
    }
}

pub(crate) fn worker(lease: &Lease) -> Actor {
    Actor::Worker(lease.owner.clone())
}
