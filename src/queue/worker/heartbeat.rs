//! The worker's heartbeat: renews every lease it holds (and its registry row) on a
//! connection of its own, moves each renewed lease's local deadline ([`crate::queue::worker::deadline`]),
//! and interrupts a job whose lease was lost. Every heartbeat is bounded: one that fails
//! or outlasts its timeout is abandoned with its connection, and the next runs on a fresh
//! one, so a connection that hangs (a partition, a frozen proxy) cannot stall renewals.

use std::sync::Arc;

use sqlx::{Connection, PgConnection};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::queue::worker::Registry;
use crate::queue::worker::deadline::LeaseTiming;
use crate::queue::{QueueError, QueuePool};
use crate::telemetry;

/// Renews every held lease, and the worker's registry row, every lease/3, and at once when
/// a job asks (`renew`: its deadline is near); a job whose lease did not renew is
/// interrupted. Jobs stopped by their deadline are renewed no more.
pub(super) async fn heartbeat(
    pool: QueuePool,
    owner: String,
    timing: LeaseTiming,
    registry: Registry,
    renew: Arc<Notify>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(timing.interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut connection: Option<PgConnection> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
            _ = renew.notified() => {}
        }
        let held: Vec<(i64, i64)> = registry
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, job)| !job.past_deadline)
            .map(|(id, job)| (*id, job.fencing_token))
            .collect();
        let sent = Instant::now();
        let renewal = tokio::time::timeout(
            timing.heartbeat_timeout,
            renew_on(&mut connection, &pool, &owner, &held, &timing),
        )
        .await;
        match renewal {
            Ok(Ok(renewed)) => confirmed(&registry, &held, &renewed, timing.deadline(sent)),
            Ok(Err(error)) => {
                connection = None;
                tracing::warn!(%error, "lease heartbeat failed; the next one opens a new connection");
            }
            Err(_) => {
                // Dropped, the connection closes its socket: whatever the database makes
                // of the statement, no answer to it is awaited any more.
                connection = None;
                tracing::warn!(timeout = ?timing.heartbeat_timeout,
                               "lease heartbeat timed out; the next one opens a new connection");
            }
        }
    }
}

/// One heartbeat on `connection`, opened first when there is none.
async fn renew_on(
    connection: &mut Option<PgConnection>,
    pool: &QueuePool,
    owner: &str,
    held: &[(i64, i64)],
    timing: &LeaseTiming,
) -> Result<Vec<i64>, QueueError> {
    let conn = match connection {
        Some(conn) => conn,
        None => {
            connection.insert(PgConnection::connect_with(&pool.pool().connect_options()).await?)
        }
    };
    crate::queue::heartbeat(conn, owner, held, timing.lease).await
}

/// Moves the deadline of every renewed lease to `deadline`, and interrupts the jobs whose
/// lease the database no longer holds for this worker.
fn confirmed(registry: &Registry, held: &[(i64, i64)], renewed: &[i64], deadline: Instant) {
    telemetry::metrics::leases_renewed(renewed.len());
    let registry = registry.lock().unwrap();
    for (job_id, _) in held {
        let Some(job) = registry.get(job_id) else {
            continue;
        };
        if job.past_deadline {
            // Stopped while the heartbeat travelled: it stays stopped.
            continue;
        }
        if renewed.contains(job_id) {
            job.deadline.send_replace(deadline);
        } else {
            tracing::warn!(job_id, "lease lost; interrupting the job");
            telemetry::metrics::lease_lost(&job.kind);
            job.interrupt.cancel();
        }
    }
}
