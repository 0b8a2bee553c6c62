//! The full claim (due jobs from the head of claim order, and expired leases) and the
//! ordered-reads settings the queue's reads rely on. While an old snapshot is held, a
//! worker claims by position instead (`snapshot`).

use std::time::Duration;

use sqlx::PgPool;

use crate::queue::Result;
use crate::queue::{Lease, QueuePool, millis, query_leases};

/// Claims up to `limit` jobs of the given kinds: due pending jobs by priority, and jobs
/// whose lease expired (their worker died or hung). One statement, one round trip.
pub async fn claim(
    pool: &QueuePool,
    owner: &str,
    kinds: &[String],
    limit: i64,
    lease: Duration,
) -> Result<Vec<Lease>> {
    // The picked rows are leased by an array of ids, not joined: a queue's statistics are
    // always stale (analyzed while the table was near empty), and the join was planned as
    // a walk of the whole primary key, every entry an old snapshot keeps included.
    let leases = query_leases!(
        "WITH expired AS (
             SELECT id FROM queue_jobs
             WHERE lease_owner IS NOT NULL AND lease_expires_at < now() AND kind = ANY($3)
             ORDER BY lease_expires_at LIMIT $4 FOR UPDATE SKIP LOCKED
         ), due AS (
             -- Per kind, so each read is one ordered scan of queue_jobs_due. With several
             -- kinds, rows locked past the outer LIMIT are only held until this statement
             -- commits.
             SELECT j.id FROM unnest($3::text[]) AS k(kind) CROSS JOIN LATERAL (
                 SELECT id, priority, run_after FROM queue_jobs
                 WHERE kind = k.kind AND lease_owner IS NULL AND run_after <= now()
                 ORDER BY priority DESC, run_after, id LIMIT $4 FOR UPDATE SKIP LOCKED
             ) j
             ORDER BY j.priority DESC, j.run_after, j.id LIMIT $4
         ), picked AS (
             SELECT id FROM expired UNION ALL SELECT id FROM due LIMIT $4
         ), ended AS (
             SELECT archive_leases(array_agg(q), array_agg('expired'::text))
             FROM queue_jobs q
             WHERE q.id IN (SELECT id FROM expired) AND q.id IN (SELECT id FROM picked)
         ),",
        "FROM leased, ended ORDER BY priority DESC, run_after, job_id",
        owner,
        millis(lease),
        kinds,
        limit,
    )
    .fetch_all(&pool.0)
    .await?;
    Ok(leases)
}

/// Starts a transaction for the queue's ordered reads outside a [`QueuePool`] (the
/// reconciler's scans for expired leases, fair claims): it leaves the planner one way to
/// run them, a walk of the index in the order read, which stops at the LIMIT. A queue's
/// statistics describe whatever the table held at the last ANALYZE: one that sampled
/// mostly dead rows (an old snapshot held) estimates a few live ones, and the planner then
/// reads every entry of the kind through a bitmap and sorts them. Sorting what an ordered
/// read returns, reading through a bitmap and scanning the heap are all plans that read
/// everything matching before the LIMIT counts, so they are turned off here (for this
/// transaction only; off means priced out, so a sort with no other way is still done).
/// JIT goes too: the price of what is turned off puts every claim far above
/// `jit_above_cost`, and compiling each claim takes longer than running it. And each
/// statement is planned with its own values (a generic plan is blind to the window an
/// expired-lease scan reads from), as on the queue's own connections.
pub async fn begin_ordered_reads(
    pool: &PgPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    static BEGIN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let settings = ORDERED_READS.map(|(name, value)| format!("SET LOCAL {name} = {value}"));
        format!("BEGIN; {}", settings.join("; "))
    });
    Ok(pool.begin_with(BEGIN.as_str()).await?)
}

/// The planner settings of ordered reads ([`begin_ordered_reads`] says why), set per
/// transaction there and per session on the queue's own connections
/// ([`super::QueuePool`]).
pub(crate) const ORDERED_READS: [(&str, &str); 5] = [
    ("enable_sort", "off"),
    ("enable_bitmapscan", "off"),
    ("enable_seqscan", "off"),
    ("jit", "off"),
    ("plan_cache_mode", "force_custom_plan"),
];
