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
    let rows = match status {
        LeaseStatus::Active | LeaseStatus::Expired => {
            sqlx::query_as!(
                LeaseRow,
                r#"SELECT id AS cursor,
                          CASE WHEN lease_expires_at > now() THEN 'active' ELSE 'expired' END
                              AS "status!",
                          id AS job_id, kind, ref_id, lease_owner AS "owner!", fencing_token,
                          claimed_at AS "claimed_at!", lease_expires_at AS "expires_at!",
                          heartbeats, NULL::timestamptz AS released_at, NULL::text AS outcome
                   FROM queue_jobs
                   WHERE workspace_id = $4 AND lease_owner IS NOT NULL
                     AND (lease_expires_at > now()) = $1 AND id > $2
                   ORDER BY id LIMIT $3"#,
                status == LeaseStatus::Active,
                after,
                limit,
                scope.workspace(),
            )
            .fetch_all(conn)
            .await?
        }
        LeaseStatus::Released => {
            sqlx::query_as!(
                LeaseRow,
                r#"SELECT id AS cursor, 'released' AS "status!", job_id, kind, ref_id, owner,
                          fencing_token, claimed_at, expires_at, heartbeats,
                          released_at AS "released_at?", outcome AS "outcome?"
                   FROM lease_history WHERE workspace_id = $1 AND id > $2
                   ORDER BY id LIMIT $3"#,
                scope.workspace(),
                after,
                limit,
            )
            .fetch_all(conn)
            .await?
        }
    };
    Ok(rows.into_iter().map(LeaseRow::paged).collect())
}

/// A lease and its cursor in the list it was read from.
struct LeaseRow {
    cursor: i64,
    status: String,
    job_id: i64,
    kind: String,
    ref_id: String,
    owner: String,
    fencing_token: i64,
    claimed_at: chrono::DateTime<chrono::Utc>,
    expires_at: chrono::DateTime<chrono::Utc>,
    heartbeats: i32,
    released_at: Option<chrono::DateTime<chrono::Utc>>,
    outcome: Option<String>,
}

impl LeaseRow {
    fn paged(self) -> (i64, LeaseRecord) {
        let lease = LeaseRecord {
            status: self.status,
            job_id: self.job_id,
            kind: self.kind,
            ref_id: self.ref_id,
            owner: self.owner,
            fencing_token: self.fencing_token,
            claimed_at: self.claimed_at,
            expires_at: self.expires_at,
            heartbeats: self.heartbeats,
            released_at: self.released_at,
            outcome: self.outcome,
        };
        (self.cursor, lease)
    }
}

/// Forgets ended leases older than `days`, in every workspace (retention); rows another
/// replica's pass holds are left to it.
pub(crate) async fn prune(conn: &mut PgConnection, days: i32) -> Result<u64> {
    let done = sqlx::query!(
        "DELETE FROM lease_history WHERE id IN (
             SELECT id FROM lease_history WHERE released_at < now() - make_interval(days => $1)
             FOR UPDATE SKIP LOCKED)",
        days,
    )
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}
