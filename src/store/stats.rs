//! Queue and worker figures for `GET /v1/system/stats`.

use sqlx::PgConnection;

use super::Result;
use crate::domain::Scope;

/// A worker is live while its registry heartbeat is younger than this.
pub const WORKER_LIVE_MS: i64 = 30_000;

pub use keel_api_types::{KindStats, WorkerStats};

/// One workspace's queue figures, for `GET /v1/system/stats`.
pub async fn queue(conn: &mut PgConnection, scope: &Scope) -> Result<Vec<KindStats>> {
    queue_of(conn, Some(scope.workspace())).await
}

/// The figures of the whole queue, every workspace's jobs together: for the operator's
/// metrics, never for an API response.
pub async fn queue_everywhere(conn: &mut PgConnection) -> Result<Vec<KindStats>> {
    queue_of(conn, None).await
}

async fn queue_of(conn: &mut PgConnection, workspace: Option<&str>) -> Result<Vec<KindStats>> {
    let rows = sqlx::query_as(
        "SELECT kind,
                count(*) FILTER (WHERE lease_owner IS NULL) AS depth,
                count(*) FILTER (WHERE lease_owner IS NULL AND run_after <= now()) AS ready,
                count(*) FILTER (WHERE lease_owner IS NOT NULL) AS leased,
                (extract(epoch FROM now() - min(run_after)
                    FILTER (WHERE lease_owner IS NULL AND run_after <= now())) * 1000)::bigint
                    AS oldest_age_ms
         FROM queue_jobs WHERE $1::text IS NULL OR workspace_id = $1
         GROUP BY kind ORDER BY kind",
    )
    .bind(workspace)
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Workers whose heartbeat is younger than `live_ms`. Workers serve every workspace and
/// their rows hold no tenant data, so the list is the same for everyone; the leases each
/// holds are counted in `scope` alone, so one workspace cannot watch another's activity.
pub async fn live_workers(
    conn: &mut PgConnection,
    scope: &Scope,
    live_ms: i64,
) -> Result<Vec<WorkerStats>> {
    workers_of(conn, Some(scope.workspace()), live_ms).await
}

/// The live workers with every workspace's leases: for the operator's metrics, never for
/// an API response.
pub async fn live_workers_everywhere(
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
    let rows = sqlx::query_as(
        "SELECT w.id, w.hostname, w.pid, w.kinds, w.concurrency,
                (SELECT count(*) FROM queue_jobs q
                  WHERE q.lease_owner = w.id AND q.lease_expires_at > now()
                    AND ($2::text IS NULL OR q.workspace_id = $2)) AS active_leases,
                (extract(epoch FROM now() - w.last_seen_at) * 1000)::bigint AS last_seen_ms_ago
         FROM workers w
         WHERE w.last_seen_at > now() - $1 * interval '1 millisecond'
         ORDER BY w.id",
    )
    .bind(live_ms)
    .bind(workspace)
    .fetch_all(conn)
    .await?;
    Ok(rows)
}
