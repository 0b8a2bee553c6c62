//! Ending an attempt, for the queue: every attempt of every kind ends with one
//! [`Disposition`], settled by one fenced statement (in the manner of River's
//! `JobSetStateIfRunning` and Oban's worker return values). The row goes, or comes back to
//! be claimed later; either way the lease is archived to `lease_history`. One job settles
//! inside the caller's transaction, beside the domain change it belongs with ([`settle`]);
//! many jobs of one worker, each fenced by its own token, settle in one statement
//! ([`settle_many`]: the bench's no-op kind batches its acks with it).

use std::time::Duration;

use sqlx::PgConnection;

use super::{JOBS_CHANNEL, Lease, QueueError, QueuePool, Result, millis};

/// How an attempt leaves its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// The job is done: its row goes (archived as `acked`).
    Complete,
    /// The attempt failed: the job is due again after `delay` with `error` recorded, and
    /// the attempt counts toward its limit (archived as `retried`).
    Retry { error: String, delay: Duration },
    /// Not done and nothing failed: due again after `delay`, the attempt given back (a
    /// background poll's next pass; archived as `released`).
    Snooze { reason: String, delay: Duration },
    /// Handed back at once with the attempt given back: the worker is shutting down
    /// (archived as `released`).
    Release,
}

/// Why a job comes back: what its row records as `last_error`.
const RELEASED: &str = "worker shut down";

impl Disposition {
    /// The name the settle statement reads.
    fn name(&self) -> &'static str {
        match self {
            Disposition::Complete => "complete",
            Disposition::Retry { .. } => "retry",
            Disposition::Snooze { .. } => "snooze",
            Disposition::Release => "release",
        }
    }

    fn delay_ms(&self) -> i64 {
        match self {
            Disposition::Retry { delay, .. } | Disposition::Snooze { delay, .. } => millis(*delay),
            Disposition::Complete | Disposition::Release => 0,
        }
    }

    fn error(&self) -> Option<&str> {
        match self {
            Disposition::Retry { error, .. } => Some(error),
            Disposition::Snooze { reason, .. } => Some(reason),
            Disposition::Release => Some(RELEASED),
            Disposition::Complete => None,
        }
    }
}

/// One held job and how its attempt ends.
#[derive(Debug, Clone)]
pub struct Settlement {
    pub job_id: i64,
    pub fencing_token: i64,
    pub disposition: Disposition,
}

impl Settlement {
    pub fn of(lease: &Lease, disposition: Disposition) -> Settlement {
        Settlement {
            job_id: lease.job_id,
            fencing_token: lease.fencing_token,
            disposition,
        }
    }
}

/// Settles one job in the caller's transaction, with the domain change it belongs with;
/// `LeaseLost` when this worker no longer holds it.
pub async fn settle(
    conn: &mut PgConnection,
    lease: &Lease,
    disposition: Disposition,
) -> Result<()> {
    let settled = statement(conn, &lease.owner, &[Settlement::of(lease, disposition)]).await?;
    if settled.is_empty() {
        return Err(QueueError::LeaseLost);
    }
    Ok(())
}

/// Settles many jobs of `owner` in one statement, each fenced by its own token; returns
/// the ids settled (a job missing from them had lost its lease).
pub async fn settle_many(
    pool: &QueuePool,
    owner: &str,
    settlements: &[Settlement],
) -> Result<Vec<i64>> {
    let mut conn = pool.0.acquire().await?;
    statement(&mut conn, owner, settlements).await
}

/// The one settle statement. Completed jobs are deleted and the others handed back by two
/// statements that each check the fence themselves, so a row is locked once, by the write
/// that ends its lease, and a lease lost meanwhile is rechecked by PostgreSQL under that lock.
/// Each looks its rows up by id (`ids` is sorted: `width_bucket` finds a row's settlement by
/// binary search) rather than joining an `unnest` (docs/benchmarks.md, "Why the queue's
/// statements look as they do"). Both archive what the lease was through `archive_leases`
/// (a handed-back job's row as it stood before the update). A job that comes back wakes the
/// workers of its kind.
async fn statement(
    conn: &mut PgConnection,
    owner: &str,
    settlements: &[Settlement],
) -> Result<Vec<i64>> {
    let mut settlements: Vec<&Settlement> = settlements.iter().collect();
    settlements.sort_unstable_by_key(|s| s.job_id);
    let ids: Vec<i64> = settlements.iter().map(|s| s.job_id).collect();
    let tokens: Vec<i64> = settlements.iter().map(|s| s.fencing_token).collect();
    let names: Vec<&str> = settlements.iter().map(|s| s.disposition.name()).collect();
    let delays: Vec<i64> = settlements
        .iter()
        .map(|s| s.disposition.delay_ms())
        .collect();
    let errors: Vec<Option<&str>> = settlements.iter().map(|s| s.disposition.error()).collect();
    let settled = sqlx::query_scalar!(
        r#"WITH done AS (
               DELETE FROM queue_jobs q
               WHERE q.id = ANY($1) AND q.lease_owner IS NOT DISTINCT FROM $3
                 AND q.fencing_token = ($2::bigint[])[width_bucket(q.id, $1)]
                 AND ($4::text[])[width_bucket(q.id, $1)] = 'complete'
               RETURNING q AS job
           ), again AS (
               UPDATE queue_jobs q
               SET lease_owner = NULL, lease_expires_at = NULL,
                   last_error = ($6::text[])[width_bucket(q.id, $1)],
                   run_after = now()
                       + ($5::bigint[])[width_bucket(q.id, $1)] * interval '1 millisecond',
                   attempts = q.attempts
                       - CASE ($4::text[])[width_bucket(q.id, $1)] WHEN 'retry' THEN 0 ELSE 1 END
               FROM queue_jobs before
               -- Decided once per statement: a batch of completions skips this scan.
               WHERE NOT ('complete' = ALL($4::text[]))
                 AND before.id = q.id AND q.id = ANY($1)
                 AND q.lease_owner IS NOT DISTINCT FROM $3
                 AND q.fencing_token = ($2::bigint[])[width_bucket(q.id, $1)]
                 AND ($4::text[])[width_bucket(q.id, $1)] <> 'complete'
               RETURNING before AS job,
                   CASE ($4::text[])[width_bucket(q.id, $1)] WHEN 'retry' THEN 'retried'
                                                                ELSE 'released' END AS outcome
           ), ended AS (
               SELECT job, 'acked' AS outcome FROM done
               UNION ALL SELECT job, outcome FROM again
           ), archived AS (
               SELECT archive_leases(array_agg(job), array_agg(outcome)) AS count FROM ended
           ), woken AS (
               SELECT count(pg_notify($7, kind)) AS count
               FROM (SELECT DISTINCT (job).kind FROM again) k
           )
           SELECT (e.job).id AS "id!" FROM ended e, archived, woken"#,
        &ids,
        &tokens,
        owner,
        &names as &[&str],
        &delays,
        &errors as &[Option<&str>],
        JOBS_CHANNEL,
    )
    .fetch_all(conn)
    .await?;
    Ok(settled)
}

/// Exponential backoff for the n-th failed attempt: 1 s, 2 s, 4 s … capped at 5 minutes.
pub fn backoff(attempts: i32) -> Duration {
    let exponent = attempts.clamp(1, 20) as u32 - 1;
    Duration::from_secs(2u64.saturating_pow(exponent).min(300))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(50), Duration::from_secs(300));
    }
}
