//! The worker's notification listener: wakes the claim loop on new jobs and interrupts
//! the jobs whose domain row was withdrawn.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::queue::worker::Registry;
use crate::queue::{CANCEL_CHANNEL, JOBS_CHANNEL, QueueError};

/// A connection of its own listening on the queue's channels.
pub(super) async fn subscribe(pool: &PgPool) -> Result<PgListener, QueueError> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen_all([JOBS_CHANNEL, CANCEL_CHANNEL]).await?;
    Ok(listener)
}

/// Wakes the claim loop on new jobs and interrupts jobs whose domain row was withdrawn.
pub(super) async fn listen(
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
