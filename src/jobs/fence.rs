//! What every executor context shares: each write it makes for a job is one transaction
//! fenced by the job's lease, and a lost lease interrupts the attempt.

use keel_workers::ContextError;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::queue::worker::Job;
use crate::queue::{self, Lease};
use crate::store::StoreError;

pub struct Fence {
    pool: PgPool,
    lease: Lease,
    /// Fires when the job is cancelled or the lease lost.
    pub interrupt: CancellationToken,
}

impl Fence {
    pub fn new(pool: &PgPool, job: &Job) -> Fence {
        Fence {
            pool: pool.clone(),
            lease: job.lease.clone(),
            interrupt: job.interrupt.clone(),
        }
    }

    /// A transaction holding the job row, or `Interrupted` once the lease is gone.
    pub async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, ContextError> {
        if self.interrupt.is_cancelled() {
            return Err(ContextError::Interrupted);
        }
        queue::begin_fenced(&self.pool, &self.lease)
            .await
            .map_err(|e| self.context_error(e))
    }

    pub fn context_error(&self, error: StoreError) -> ContextError {
        match error {
            StoreError::LeaseLost => {
                tracing::warn!(kind = %self.lease.kind, ref_id = %self.lease.ref_id,
                               "lease lost; stopping the attempt");
                self.interrupt.cancel();
                ContextError::Interrupted
            }
            other => ContextError::Runtime(other.to_string()),
        }
    }

    pub async fn commit(
        &self,
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
    ) -> Result<(), ContextError> {
        tx.commit().await.map_err(|e| self.context_error(e.into()))
    }
}
