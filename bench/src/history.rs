//! The history figure: queue throughput with an empty history, then with a million
//! finished jobs in it. A finished job leaves the queue table (ack deletes its row); what
//! remains of it is its `lease_history` row, so that is where the history is put.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::RunArgs;
use super::noop::KIND;
use super::queue::throughput;
use super::stats::Throughput;

#[derive(Debug, Serialize, Deserialize)]
pub struct HistoryFigures {
    pub history_rows: i64,
    pub empty: Throughput,
    pub full: Throughput,
    /// full / empty jobs/s (the target is ≥ 0.9).
    pub ratio: f64,
}

pub async fn figures(pool: &PgPool, url: &str, args: &RunArgs) -> anyhow::Result<HistoryFigures> {
    clear_history(pool).await?;
    let empty = throughput(pool, url, args.jobs, args.concurrency, args.prefetch).await?;
    clear_history(pool).await?;
    seed(pool, args.history_rows).await?;
    let full = throughput(pool, url, args.jobs, args.concurrency, args.prefetch).await?;
    clear_history(pool).await?;
    Ok(HistoryFigures {
        history_rows: args.history_rows,
        ratio: full.jobs_per_s / empty.jobs_per_s,
        empty,
        full,
    })
}

async fn clear_history(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query("TRUNCATE lease_history").execute(pool).await?;
    Ok(())
}

/// Finished jobs as acks leave them, then vacuumed and analyzed as a history of that size
/// would have been by autovacuum.
async fn seed(pool: &PgPool, rows: i64) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO lease_history (job_id, kind, ref_id, owner, fencing_token, claimed_at,
                                    expires_at, heartbeats, released_at, outcome, workspace_id)
         SELECT g, $1, 'h-' || g, 'wrk_history', 1, now() - interval '1 hour',
                now() - interval '59 minutes', 0, now() - interval '1 hour', 'acked', 'default'
         FROM generate_series(1, $2) AS g",
    )
    .bind(KIND)
    .bind(rows)
    .execute(pool)
    .await?;
    sqlx::raw_sql("VACUUM ANALYZE lease_history")
        .execute(pool)
        .await?;
    Ok(())
}
