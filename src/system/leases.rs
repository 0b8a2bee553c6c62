//! Queue leases for diagnostics: live ones from `queue_jobs`, ended ones from
//! `lease_history` (pruned after a retention window).

use sqlx::PgConnection;

use crate::db::Result;
use crate::domain::Scope;

pub(crate) use keel_api_types::LeaseRecord;

pub use keel_api_types::LeaseStatus;

/// Live leases by job id, or released ones by history id; `after` is the previous page's
/// last cursor.
pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    status: LeaseStatus,
    after: i64,
    limit: i64,
) -> Result<Vec<(i64, LeaseRecord)>> {
    let live = "SELECT id AS cursor, CASE WHEN lease_expires_at > now() THEN 'active' ELSE 'expired' END AS status,
                       id AS job_id, kind, ref_id, lease_owner AS owner, fencing_token, claimed_at,
                       lease_expires_at AS expires_at, heartbeats, NULL::timestamptz AS released_at,
                       NULL::text AS outcome
                FROM queue_jobs
                WHERE workspace_id = $4 AND lease_owner IS NOT NULL
                  AND (lease_expires_at > now()) = $1 AND id > $2
                ORDER BY id LIMIT $3";
    let released =
        "SELECT id AS cursor, 'released' AS status, job_id, kind, ref_id, owner, fencing_token,
                           claimed_at, expires_at, heartbeats, released_at, outcome
                    FROM lease_history WHERE workspace_id = $4 AND $1 AND id > $2
                    ORDER BY id LIMIT $3";
    let (query, live_flag) = match status {
        LeaseStatus::Active => (live, true),
        LeaseStatus::Expired => (live, false),
        LeaseStatus::Released => (released, true),
    };
    let rows: Vec<LeaseRow> = sqlx::query_as(query)
        .bind(live_flag)
        .bind(after)
        .bind(limit)
        .bind(scope.workspace())
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.cursor, row.lease))
        .collect())
}

#[derive(sqlx::FromRow)]
struct LeaseRow {
    cursor: i64,
    #[sqlx(flatten)]
    lease: LeaseRecord,
}

/// Forgets ended leases older than `days`, in every workspace (retention).
pub(crate) async fn prune(conn: &mut PgConnection, days: i32) -> Result<u64> {
    let done = sqlx::query(
        "DELETE FROM lease_history WHERE released_at < now() - make_interval(days => $1)",
    )
    .bind(days)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}
