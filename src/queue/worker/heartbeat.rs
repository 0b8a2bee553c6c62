//! The worker's heartbeat: renews every lease it holds (and its registry row) on its own
//! connection, and interrupts a job whose lease was lost.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Registry;
use crate::queue::QueuePool;
use crate::telemetry;

/// Renews every held lease, and the worker's registry row, every lease/3; a job whose
/// lease did not renew is interrupted.
pub(super) async fn heartbeat(
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
        match crate::queue::heartbeat(&pool, &owner, &held, lease).await {
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
