//! Queue and worker figures for `GET /v1/system/stats`, and the queue's throughput for
//! `GET /v1/system/throughput`.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::db::Result;
use crate::domain::Scope;

/// A worker is live while its registry heartbeat is younger than this.
pub(crate) const WORKER_LIVE_MS: i64 = 30_000;

pub(crate) use keel_api_types::{
    KindStats, KindThroughput, Throughput, ThroughputBucket, WorkerStats,
};

/// One workspace's queue figures, for `GET /v1/system/stats`.
pub async fn queue(conn: &mut PgConnection, scope: &Scope) -> Result<Vec<KindStats>> {
    queue_of(conn, Some(scope.workspace())).await
}

/// The figures of the whole queue, every workspace's jobs together: for the operator's
/// metrics, never for an API response.
pub(crate) async fn queue_everywhere(conn: &mut PgConnection) -> Result<Vec<KindStats>> {
    queue_of(conn, None).await
}

async fn queue_of(conn: &mut PgConnection, workspace: Option<&str>) -> Result<Vec<KindStats>> {
    let rows = sqlx::query_as!(
        KindStats,
        r#"SELECT kind,
                  count(*) FILTER (WHERE lease_owner IS NULL) AS "depth!",
                  count(*) FILTER (WHERE lease_owner IS NULL AND run_after <= now()) AS "ready!",
                  count(*) FILTER (WHERE lease_owner IS NOT NULL) AS "leased!",
                  (extract(epoch FROM now() - min(run_after)
                      FILTER (WHERE lease_owner IS NULL AND run_after <= now())) * 1000)::bigint
                      AS oldest_age_ms
           FROM queue_jobs WHERE $1::text IS NULL OR workspace_id = $1
           GROUP BY kind ORDER BY kind"#,
        workspace,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Workers whose heartbeat is younger than `live_ms`. Workers serve every workspace and
/// their rows hold no tenant data, so the list is the same for everyone; the leases each
/// holds are counted in `scope` alone, so one workspace cannot watch another's activity.
pub(crate) async fn live_workers(
    conn: &mut PgConnection,
    scope: &Scope,
    live_ms: i64,
) -> Result<Vec<WorkerStats>> {
    workers_of(conn, Some(scope.workspace()), live_ms).await
}

/// The live workers with every workspace's leases: for the operator's metrics, never for
/// an API response.
pub(crate) async fn live_workers_everywhere(
    conn: &mut PgConnection,
    live_ms: i64,
) -> Result<Vec<WorkerStats>> {
    workers_of(conn, None, live_ms).await
}

async fn workers_of(
    conn: &mut PgConnection,
    workspace: Option<&str>,
    live_ms: i64,
) -> Result<Vec<WorkerStats>> {
    let rows = sqlx::query_as!(
        WorkerStats,
        r#"SELECT w.id, w.hostname AS "hostname?", w.pid AS "pid?", w.kinds, w.concurrency,
                  (SELECT count(*) FROM queue_jobs q
                    WHERE q.lease_owner = w.id AND q.lease_expires_at > now()
                      AND ($2::text IS NULL OR q.workspace_id = $2)) AS "active_leases!",
                  (extract(epoch FROM now() - w.last_seen_at) * 1000)::bigint
                      AS "last_seen_ms_ago!"
           FROM workers w
           WHERE w.last_seen_at > now() - $1::bigint * interval '1 millisecond'
           ORDER BY w.id"#,
        live_ms,
        workspace,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Width of a throughput bucket for a window of `minutes`: at most 90 buckets.
pub(crate) fn bucket_seconds(minutes: i64) -> i64 {
    if minutes <= 15 { 10 } else { 60 }
}

/// The workspace's ended attempts of the last `minutes`, from `lease_history` (every ack,
/// nack and takeover writes a row there, stamped `released_at`).
///
/// Cheap at any volume: `released_at` is its transaction's start and ids grow with
/// inserts, so the window's rows all come after the anchor, the last row released over a
/// minute before the window (or, with none, the table's start). Rows are not in
/// `released_at` order by id (a transaction that began earlier can insert later), so the
/// anchor is a row before the window, not the window's earliest row: with that, a fresh
/// table lost the rows inserted before its earliest-started one. The anchor is one probe
/// of the `released_at` index (`since` is a scalar subquery so it is an index condition;
/// as a join it is a filter over the whole index), the rows an id range — the indexes the
/// table already has, so settles (the hot path) pay for no new one. A row is missed only if the anchor's transaction ran for
/// over a minute before it wrote its row; the acking transactions are short.
pub(crate) async fn throughput(
    conn: &mut PgConnection,
    scope: &Scope,
    minutes: i64,
) -> Result<Throughput> {
    let width = bucket_seconds(minutes);
    let count = minutes * 60 / width;
    let rows = sqlx::query_as!(
        BucketRow,
        r#"WITH bounds AS (
             SELECT to_timestamp((floor(extract(epoch FROM now()) / $2::bigint) - ($3::bigint - 1)) * $2::bigint) AS since
         ), anchor AS (
             SELECT coalesce((SELECT h.id FROM lease_history h
                              WHERE h.released_at < (SELECT since FROM bounds) - interval '1 minute'
                              ORDER BY h.released_at DESC LIMIT 1), 0) AS id
         )
         SELECT b.since AS "since!", h.kind AS "kind?",
                floor(extract(epoch FROM h.released_at - b.since) / $2::bigint)::bigint AS bucket,
                count(*) FILTER (WHERE h.outcome = 'acked') AS "completed!",
                count(*) FILTER (WHERE h.outcome IN ('retried', 'expired')) AS "failed!"
         FROM bounds b
         LEFT JOIN lease_history h
                ON h.workspace_id = $1 AND h.id > (SELECT id FROM anchor)
               AND h.released_at >= b.since AND h.outcome IN ('acked', 'retried', 'expired')
         GROUP BY b.since, h.kind, bucket
         ORDER BY h.kind, bucket"#,
        scope.workspace(),
        width,
        count,
    )
    .fetch_all(conn)
    .await?;
    // The LEFT JOIN from `bounds` gives at least one row, an empty window included.
    let since = rows.first().expect("one row per window at least").since;
    Ok(Throughput {
        minutes,
        bucket_seconds: width,
        since,
        kinds: per_kind(&rows, since, width, count),
    })
}

struct BucketRow {
    since: DateTime<Utc>,
    /// None on the one row of a window with nothing in it.
    kind: Option<String>,
    bucket: Option<i64>,
    completed: i64,
    failed: i64,
}

/// The sparse rows (ordered by kind) as every bucket of each kind.
fn per_kind(
    rows: &[BucketRow],
    since: DateTime<Utc>,
    width: i64,
    count: i64,
) -> Vec<KindThroughput> {
    let mut kinds: Vec<KindThroughput> = Vec::new();
    for row in rows {
        let (Some(kind), Some(bucket)) = (&row.kind, row.bucket) else {
            continue;
        };
        if kinds.last().is_none_or(|k| &k.kind != kind) {
            kinds.push(KindThroughput {
                kind: kind.clone(),
                completed: 0,
                failed: 0,
                buckets: (0..count)
                    .map(|n| ThroughputBucket {
                        start: since + chrono::Duration::seconds(n * width),
                        completed: 0,
                        failed: 0,
                    })
                    .collect(),
            });
        }
        let entry = kinds.last_mut().expect("pushed above");
        entry.completed += row.completed;
        entry.failed += row.failed;
        // A transaction that began just after this statement's now() can have committed a
        // row one bucket past the window: it counts in the last one.
        let slot = &mut entry.buckets[bucket.clamp(0, count - 1) as usize];
        slot.completed += row.completed;
        slot.failed += row.failed;
    }
    kinds
}
