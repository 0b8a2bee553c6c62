//! One attempt of a job that stands for a domain row (a run, a media job, an external
//! action, a polled source): the skeleton every kind shares. Each step is one transaction
//! fenced by the job's lease, with one events append: begin (take over from a lost worker,
//! give up past the attempts, or mark the row running), then exactly one of end (the row's
//! ending, settled as its kind says: complete, or snooze for a schedule that lives on),
//! retry (the row back for another attempt after a delay), hand back (at shutdown, without
//! penalty) or, when interrupted, nothing but the settle a cancel may have left to this
//! worker. Three types carry an attempt's end: the executor's `keel_workers::Outcome`, the
//! [`Verdict`] a kind makes of it, and the queue's [`Disposition`].

pub(crate) mod fence;
mod kind;
mod observe;

pub use kind::JobKind;
pub(crate) use observe::{observe, observed};

use std::time::Duration;

use keel_api_types::ErrorCode;
use sqlx::{PgConnection, PgPool};

use crate::attempt::fence::DomainRow;
use crate::db::StoreError;
use crate::domain::{Actor, Scope};
use crate::events;
use crate::events::NewEvent;
use crate::queue::worker::Job;
use crate::queue::{self, Disposition, Lease};
use crate::telemetry::metrics;

/// What a domain row does at each step of an attempt. Every method writes in the caller's
/// transaction and returns the events for the caller to append, last; or appends them
/// with its own last write (returning none), which saves their statement.
pub(crate) trait Attempted: DomainRow + Clone + Sync {
    /// How an attempt that ran to its end leaves the row.
    type Ending: Send + Sync;
    /// What the kind's endings need beyond the row (where an action's evidence goes); `()`
    /// for a kind whose rows hold everything.
    type Context: Sync;

    /// Whether a worker is (or was, before it was lost) running the row.
    fn is_running(&self) -> bool;
    /// The ending of an attempt that used up its job's attempts, with the last failure if
    /// it failed; None for a kind whose job never gives up (a background poll's schedule).
    fn gave_up(
        &self,
        context: &Self::Context,
        error: String,
        failure: Option<&Failure>,
    ) -> Option<Self::Ending>;
    /// The job duration metric's label for an ending.
    fn label(ending: &Self::Ending) -> &'static str;

    /// Puts the row of a worker that is gone back to `queued`; returns it. A kind whose
    /// job is all its state (a poll's schedule, an action sent from its job) leaves it.
    fn requeue_lost<'r>(
        &'r self,
        _conn: &mut PgConnection,
        _scope: &Scope,
        _reason: &'static str,
        _actor: &Actor,
    ) -> impl Future<Output = Result<(Self, Vec<NewEvent<'r>>), StoreError>> + Send {
        async { Ok((self.clone(), Vec::new())) }
    }
    /// The row of a job whose lease expired and that the reconciler took back in `conn`,
    /// read without the fence the lease no longer holds. None for a kind whose job is all
    /// its state.
    fn read_lost(
        _conn: &mut PgConnection,
        _lease: &Lease,
    ) -> impl Future<Output = Result<Option<Self>, StoreError>> + Send {
        async { Ok(None) }
    }
    /// Starts a row that is simply waiting to start (a claim's usual case) with no
    /// transaction of its own: read, then moved by one statement fenced by the lease. None
    /// when it is not waiting, or no longer as read: [`begin`]'s general path then finds
    /// out why. A kind without one always takes the general path.
    fn start_waiting(
        _pool: &PgPool,
        _lease: &Lease,
    ) -> impl Future<Output = Result<Option<Self>, StoreError>> + Send {
        async { Ok(None) }
    }
    /// Marks the row running for this attempt; returns it. A kind with no running state
    /// of its own (its job's lease says it runs) leaves it.
    fn start<'r>(
        &'r self,
        _conn: &mut PgConnection,
        _lease: &Lease,
    ) -> impl Future<Output = Result<(Self, Vec<NewEvent<'r>>), StoreError>> + Send {
        async { Ok((self.clone(), Vec::new())) }
    }
    /// How the job settles after an attempt that ended so: decided before the end is
    /// written, because the settle comes first (it is the end's fence).
    fn disposition(ending: &Self::Ending) -> Disposition;
    /// Moves the row to where the ending leaves it (what the ending still carries is
    /// written too), after its job was settled in the same transaction; returns its events.
    fn end<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        ending: &'r mut Self::Ending,
    ) -> impl Future<Output = Result<Vec<NewEvent<'r>>, StoreError>> + Send;
    /// Puts the row back for another attempt after a failure, `delay` from now; returns
    /// its events.
    fn requeue<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        failure: &'r Failure,
        delay: Duration,
    ) -> impl Future<Output = Result<Vec<NewEvent<'r>>, StoreError>> + Send;
}

/// Why an attempt asks to run again: the runtime, a vendor or a tracker failed under it.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// The failure's class, which the row keeps when its job gives up.
    pub(crate) code: &'static str,
    pub(crate) message: String,
    /// When to try again, if the failure says (a vendor's or tracker's `Retry-After`);
    /// otherwise the queue's backoff.
    pub(crate) after: Option<Duration>,
}

impl Failure {
    /// A failure of the runtime itself (its store, its disk), which says nothing of when to
    /// try again.
    pub(crate) fn runtime(message: String) -> Failure {
        Failure {
            code: "runtime_error",
            message,
            after: None,
        }
    }
}

/// How an attempt's executor left it.
pub(crate) enum Verdict<E> {
    Ended(E),
    Retry(Failure),
    /// Cancelled, lease lost, or released at shutdown: see [`conclude`].
    Interrupted,
}

/// Starts an attempt: at once when the row is simply waiting ([`Attempted::start_waiting`]),
/// otherwise in one transaction that locks it. A row still running was held by a worker
/// that lost its lease: it goes back to `queued` first, so the trail shows the takeover.
/// Returns None when there is nothing to run (the row ended or is gone, or the job used up
/// its attempts).
pub(crate) async fn begin<R: Attempted>(
    pool: &PgPool,
    lease: &Lease,
    context: &R::Context,
) -> Result<Option<R>, StoreError> {
    if lease.attempts <= lease.max_attempts
        && let Some(started) = R::start_waiting(pool, lease).await?
    {
        return Ok(Some(started));
    }
    let Some((mut tx, row)) = fence::lock_unless_ended::<R>(pool, lease).await? else {
        return Ok(None);
    };
    let (scope, actor) = (lease.scope(), worker(lease));
    let reclaimed = row.is_running();
    let queued: R;
    let (current, mut events) = if reclaimed {
        let (requeued, events) = row
            .requeue_lost(&mut tx, &scope, LEASE_EXPIRED, &actor)
            .await?;
        queued = requeued;
        (&queued, events)
    } else {
        (&row, Vec::new())
    };
    if lease.attempts > lease.max_attempts {
        let error = format!("gave up after {} attempts", lease.max_attempts);
        if let Some(mut ending) = current.gave_up(context, error, None) {
            queue::settle(&mut tx, lease, R::disposition(&ending)).await?;
            events.extend(current.end(&mut tx, lease, &mut ending).await?);
            events::append(&mut tx, &scope, &events).await?;
            tx.commit().await?;
            count_reclaim(reclaimed, lease);
            return Ok(None);
        }
    }
    // A kind may append its start's events with the start's own write: what came before
    // (a takeover's) goes first.
    events::append(&mut tx, &scope, &std::mem::take(&mut events)).await?;
    let (started, started_events) = current.start(&mut tx, lease).await?;
    events::append(&mut tx, &scope, &started_events).await?;
    tx.commit().await?;
    count_reclaim(reclaimed, lease);
    Ok(Some(started))
}

/// Why a row a lost worker left running went back to `queued`, on its transition.
const LEASE_EXPIRED: &str = "worker_lease_expired";

/// The reconciler's half of a takeover, for a job whose lease expired and which it took
/// back in `conn`: the row its worker left running goes back to `queued` with its gap
/// events, so nothing sits `running` with no live worker.
pub(crate) async fn requeue_lost<R: Attempted>(
    conn: &mut PgConnection,
    lease: &Lease,
) -> Result<(), StoreError> {
    let Some(row) = R::read_lost(conn, lease).await? else {
        return Ok(());
    };
    if !row.is_running() {
        return Ok(());
    }
    let scope = lease.scope();
    let (_, events) = row
        .requeue_lost(conn, &scope, LEASE_EXPIRED, &Actor::System)
        .await?;
    events::append(conn, &scope, &events).await
}

/// Ends the attempt as the executor left it; returns the job metric's label. `row` is
/// the row [`begin`] marked running: while the lease holds, nothing else changes it.
pub(crate) async fn conclude<R: Attempted>(
    pool: &PgPool,
    job: &Job,
    row: &R,
    context: &R::Context,
    verdict: Verdict<R::Ending>,
) -> Result<&'static str, StoreError> {
    let lease = &job.lease;
    match verdict {
        Verdict::Ended(mut ending) => {
            let label = R::label(&ending);
            match finish_while_leased(pool, job, row, &mut ending).await {
                Err(StoreError::QuotaExceeded(message)) => {
                    over_quota(pool, job, row, context, message).await
                }
                done => done.map(|()| label),
            }
        }
        Verdict::Retry(failure) => {
            nack(pool, lease, row, context, failure).await?;
            Ok("retried")
        }
        Verdict::Interrupted if job.is_released() => {
            hand_back(pool, lease, row).await?;
            Ok("released")
        }
        Verdict::Interrupted => {
            tracing::info!("attempt interrupted (cancelled or lease lost); writing nothing more");
            // A cancel that found the job row locked left its settle to this worker.
            match fence::lock_unless_ended::<R>(pool, lease).await {
                Ok(_) | Err(StoreError::LeaseLost) => Ok("interrupted"),
                Err(error) => Err(error),
            }
        }
    }
}

/// Ends the row failed, as its kind gives up, when what its ending still carried (a run's
/// held steps and output) would take a run or a workspace past its byte quota: the
/// ending's writes go, the failure names the quota.
async fn over_quota<R: Attempted>(
    pool: &PgPool,
    job: &Job,
    row: &R,
    context: &R::Context,
    message: String,
) -> Result<&'static str, StoreError> {
    let failure = Failure {
        code: ErrorCode::StorageQuotaExceeded.as_str(),
        message,
        after: None,
    };
    let Some(mut ending) = row.gave_up(context, failure.message.clone(), Some(&failure)) else {
        return Err(StoreError::QuotaExceeded(failure.message));
    };
    finish_while_leased(pool, job, row, &mut ending).await?;
    Ok(R::label(&ending))
}

/// How long [`finish_while_leased`] waits before it tries again on a fresh connection.
const REFINISH_PAUSE: Duration = Duration::from_millis(200);

/// [`finish`], tried again while the database cannot be reached (a failover, a dropped
/// connection) and the lease's local deadline is a heartbeat ahead: the attempt's work is
/// done and its effects happened; given up here, the job would run again, effects and all,
/// once its lease expired. A try whose commit did go through leaves the next one fenced
/// off (the job is settled): nothing is written twice.
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

/// Begins an attempt's end with cached (generic) plans. Its statements take arrays
/// (the settle's ids, the held steps and artifacts): a custom plan knows their lengths
/// and so always looks cheaper than the generic one, and PostgreSQL planned them anew at
/// every end, 0.4 ms each (docs/benchmarks.md, "A run's writes and plans"). One
/// round trip: the setting goes in the `BEGIN`'s query and ends with the transaction.
const BEGIN_GENERIC: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan";

/// The job's settle, the row's ending and its events, in one transaction. The settle goes
/// first: it locks the job row (the order every transaction of a job takes its rows in)
/// and is the fence, so the end needs no statement of its own to check the lease.
async fn finish<R: Attempted>(
    pool: &PgPool,
    lease: &Lease,
    row: &R,
    ending: &mut R::Ending,
) -> Result<(), StoreError> {
    let mut tx = pool.begin_with(BEGIN_GENERIC).await?;
    queue::settle(&mut tx, lease, R::disposition(ending)).await?;
    let events = row.end(&mut tx, lease, ending).await?;
    events::append(&mut tx, &lease.scope(), &events).await?;
    tx.commit().await?;
    Ok(())
}

/// The runtime, a vendor or a tracker failed under the attempt: retry after a delay, or
/// give up at the limit (unless the kind never does).
async fn nack<R: Attempted>(
    pool: &PgPool,
    lease: &Lease,
    row: &R,
    context: &R::Context,
    failure: Failure,
) -> Result<(), StoreError> {
    if lease.attempts >= lease.max_attempts {
        let error = format!(
            "gave up after {} attempts: {}",
            lease.attempts, failure.message
        );
        if let Some(mut ending) = row.gave_up(context, error, Some(&failure)) {
            return finish(pool, lease, row, &mut ending).await;
        }
    }
    let mut tx = pool.begin().await?;
    let delay = failure
        .after
        .unwrap_or_else(|| queue::backoff(lease.attempts));
    let error = failure.message.clone();
    queue::settle(&mut tx, lease, Disposition::Retry { error, delay }).await?;
    let events = row.requeue(&mut tx, lease, &failure, delay).await?;
    events::append(&mut tx, &lease.scope(), &events).await?;
    tx.commit().await?;
    Ok(())
}

/// Gives the job back at shutdown so another worker takes it at once, without penalty.
async fn hand_back<R: Attempted>(pool: &PgPool, lease: &Lease, row: &R) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    queue::settle(&mut tx, lease, Disposition::Release).await?;
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
