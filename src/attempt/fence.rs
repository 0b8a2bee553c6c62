//! What every executor context shares: each write it makes for a job is one transaction
//! fenced by the job's lease, a lost lease interrupts the attempt, and no external call
//! that cannot be undone starts unless the lease's local deadline is safely ahead.

use keel_workers::ContextError;
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

use crate::db::StoreError;
use crate::domain::Scope;
use crate::queue::worker::{Job, LeaseDeadline};
use crate::queue::{self, Lease};

pub(crate) struct Fence {
    pool: PgPool,
    lease: Lease,
    /// The job's workspace: every write of the attempt goes there.
    pub(crate) scope: Scope,
    /// Fires when the job is cancelled, the lease lost or its local deadline passed.
    pub(crate) interrupt: CancellationToken,
    deadline: LeaseDeadline,
}

impl Fence {
    pub(crate) fn new(pool: &PgPool, job: &Job) -> Fence {
        Fence {
            pool: pool.clone(),
            lease: job.lease.clone(),
            scope: job.lease.scope(),
            interrupt: job.interrupt.clone(),
            deadline: job.deadline.clone(),
        }
    }

    /// Before an external call that cannot be undone (a process, a model or tool call, a
    /// tracker POST, a vendor submission): Ok while the lease's local deadline is safely
    /// ahead, renewing it first when it is near; otherwise the attempt stops here, before
    /// the call, so a worker cut off from the database makes no call after its deadline.
    pub(crate) async fn clear_ahead(&self) -> Result<(), ContextError> {
        if self.interrupt.is_cancelled() {
            return Err(ContextError::Interrupted);
        }
        if let Err(near) = self.deadline.ensure_ahead().await {
            tracing::warn!(kind = %self.lease.kind, ref_id = %self.lease.ref_id,
                           remaining = ?self.deadline.remaining(), "{near}; stopping the attempt");
            self.interrupt.cancel();
            return Err(ContextError::Interrupted);
        }
        Ok(())
    }

    /// A transaction holding the job row, or `Interrupted` once the lease is gone.
    pub(crate) async fn begin(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, ContextError> {
        if self.interrupt.is_cancelled() {
            return Err(ContextError::Interrupted);
        }
        queue::begin_fenced(&self.pool, &self.lease)
            .await
            .map_err(|e| self.context_error(e.into()))
    }

    pub(crate) fn context_error(&self, error: StoreError) -> ContextError {
        match error {
            StoreError::LeaseLost => {
                tracing::warn!(kind = %self.lease.kind, ref_id = %self.lease.ref_id,
                               "lease lost; stopping the attempt");
                self.interrupt.cancel();
                ContextError::Interrupted
            }
            // Trying again would be refused the same way.
            StoreError::QuotaExceeded(message) => ContextError::Refused(message),
            other => ContextError::Runtime(other.to_string()),
        }
    }

    pub(crate) async fn commit(
        &self,
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
    ) -> Result<(), ContextError> {
        tx.commit().await.map_err(|e| self.context_error(e.into()))
    }
}

/// The domain row a job stands for (a run, a media job, an external action, a polled
/// source), as its executor locks it when an attempt starts.
pub(crate) trait DomainRow: Sized + Send {
    /// The row, locked after its job row, which the lease must still hold (`LeaseLost`
    /// otherwise): every transaction of a job takes the job row first. None when the row is
    /// gone (and its job with nothing left to do). A kind may check the lease in the
    /// statement that locks its row.
    fn lock(
        conn: &mut PgConnection,
        lease: &Lease,
    ) -> impl Future<Output = Result<Option<Self>, StoreError>> + Send;
    /// Whether the row reached a terminal state (cancelled while queued, or finished by an
    /// earlier holder): the job then has nothing left to do.
    fn has_ended(&self) -> bool;
}

/// Opens the attempt's fenced transaction and locks the job's domain row in it; when the row
/// has already ended or is gone, completes the job in that transaction instead and returns
/// None.
pub(crate) async fn lock_unless_ended<R: DomainRow>(
    pool: &PgPool,
    lease: &Lease,
) -> Result<Option<(sqlx::Transaction<'static, sqlx::Postgres>, R)>, StoreError> {
    let mut tx = pool.begin().await?;
    match R::lock(&mut tx, lease).await? {
        Some(row) if !row.has_ended() => Ok(Some((tx, row))),
        _ => {
            queue::settle(&mut tx, lease, queue::Disposition::Complete).await?;
            tx.commit().await?;
            Ok(None)
        }
    }
}
