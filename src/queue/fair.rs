//! The fair claim, for deployments with more than one workspace: each workspace's due
//! jobs are read from the head of its own stretch of `queue_jobs_workspace_due`, at most
//! its free slots (its limit less the leases it holds), and a claim takes every
//! workspace's first job before any workspace's second, least busy workspace first. So a
//! workspace with a thousand queued runs delays another's first run by at most one claim,
//! and none runs more jobs at once than its limit. The claim takes the workspaces'
//! advisory locks first (in one order, so claims cannot deadlock) and counts their leases
//! in a second statement, whose snapshot sees every claim that held those locks before.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use crate::queue::Result;
use crate::queue::{Lease, begin_ordered_reads, millis, query_leases};

/// Claims up to `limit` jobs of `kind` fairly across workspaces, none beyond its limit
/// (`default_max` for workspaces without an operator's override). Two statements in one
/// transaction of ordered reads.
pub async fn claim(
    pool: &PgPool,
    owner: &str,
    kind: &str,
    limit: i64,
    lease: Duration,
    default_max: u32,
) -> Result<Vec<Lease>> {
    let mut tx = begin_ordered_reads(pool).await?;
    let workspaces = lock_workspaces_with_work(&mut tx, kind).await?;
    if workspaces.is_empty() {
        tx.commit().await?;
        return Ok(Vec::new());
    }
    let leases =
        claim_within_room(&mut tx, owner, kind, limit, lease, &workspaces, default_max).await?;
    tx.commit().await?;
    Ok(leases)
}

/// How long a worker goes by what it last read of [`any_operator_limit`]: a limit set
/// where none was binds within this (a change to one that exists, at the next claim).
pub const OPERATOR_LIMITS_TTL: Duration = Duration::from_secs(2);

/// Whether an operator set any workspace's limit: a worker without a per-workspace limit
/// of its own then claims fairly, so that the limit binds.
pub async fn any_operator_limit(pool: &PgPool) -> Result<bool> {
    let any = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM workspace_limits
                          WHERE max_concurrent IS NOT NULL) AS "any!""#
    )
    .fetch_one(pool)
    .await?;
    Ok(any)
}

/// The workspaces with due jobs of the kind (found by skipping from one workspace's
/// stretch of the index to the next) or with expired leases of it, each locked for the
/// claim's transaction, in one order.
async fn lock_workspaces_with_work(conn: &mut PgConnection, kind: &str) -> Result<Vec<String>> {
    let workspaces = sqlx::query!(
        r#"WITH RECURSIVE due AS (
        (SELECT workspace_id FROM queue_jobs
         WHERE kind = $1 AND lease_owner IS NULL AND run_after <= now()
         ORDER BY workspace_id LIMIT 1)
        UNION ALL
        SELECT (SELECT q.workspace_id FROM queue_jobs q
                WHERE q.kind = $1 AND q.lease_owner IS NULL AND q.run_after <= now()
                  AND q.workspace_id > due.workspace_id
                ORDER BY q.workspace_id LIMIT 1)
        FROM due WHERE due.workspace_id IS NOT NULL
    ), found AS (
        SELECT workspace_id FROM due WHERE workspace_id IS NOT NULL
        UNION
        SELECT workspace_id FROM queue_jobs
        WHERE lease_owner IS NOT NULL AND lease_expires_at < now() AND kind = $1
    ), ordered AS (
        SELECT workspace_id FROM found ORDER BY workspace_id
    )
    SELECT workspace_id AS "workspace_id!",
           pg_advisory_xact_lock(hashtextextended('keel.workspace.' || workspace_id, 0))::text
    FROM ordered"#,
        kind,
    )
    .fetch_all(conn)
    .await?
    .into_iter()
    .map(|row| row.workspace_id)
    .collect();
    Ok(workspaces)
}

/// Up to `limit` jobs from the locked `workspaces`, each within its limit (its row in
/// `workspace_limits`, else `default_max`), leased by an array of ids as the plain claim
/// leases them.
async fn claim_within_room(
    conn: &mut PgConnection,
    owner: &str,
    kind: &str,
    limit: i64,
    lease: Duration,
    workspaces: &[String],
    default_max: u32,
) -> Result<Vec<Lease>> {
    query_leases!(
        "WITH running AS (
        SELECT workspace_id, count(*) AS held FROM queue_jobs
        WHERE lease_owner IS NOT NULL AND lease_expires_at >= now() AND workspace_id = ANY($5)
        GROUP BY workspace_id
    ), room AS (
        SELECT w.workspace_id, coalesce(r.held, 0) AS held,
               greatest(coalesce(l.max_concurrent, $6) - coalesce(r.held, 0), 0) AS free
        FROM unnest($5::text[]) AS w(workspace_id)
        LEFT JOIN running r USING (workspace_id)
        LEFT JOIN workspace_limits l USING (workspace_id)
    ), candidates AS (
        SELECT j.*, true AS expired FROM room CROSS JOIN LATERAL (
            SELECT id, workspace_id, priority, run_after FROM queue_jobs
            WHERE lease_owner IS NOT NULL AND lease_expires_at < now() AND kind = $3
              AND workspace_id = room.workspace_id
            ORDER BY lease_expires_at LIMIT least(room.free, $4) FOR UPDATE SKIP LOCKED
        ) j
        UNION ALL
        SELECT j.*, false FROM room CROSS JOIN LATERAL (
            SELECT id, workspace_id, priority, run_after FROM queue_jobs
            WHERE kind = $3 AND workspace_id = room.workspace_id AND lease_owner IS NULL
              AND run_after <= now()
            ORDER BY priority DESC, run_after, id LIMIT least(room.free, $4) FOR UPDATE SKIP LOCKED
        ) j
    ), turns AS (
        SELECT c.*, room.held, room.free,
               row_number() OVER (PARTITION BY c.workspace_id
                                  ORDER BY c.expired DESC, c.priority DESC, c.run_after, c.id) AS turn
        FROM candidates c JOIN room USING (workspace_id)
    ), picked AS (
        SELECT id, expired FROM turns WHERE turn <= free
        ORDER BY turn, held, priority DESC, run_after, id LIMIT $4
    ), ended AS (
        SELECT archive_leases(array_agg(q), array_agg('expired'::text))
        FROM queue_jobs q WHERE q.id IN (SELECT id FROM picked WHERE expired)
    ),",
        "FROM leased, ended ORDER BY priority DESC, run_after, job_id",
        owner,
        millis(lease),
        kind,
        limit,
        workspaces,
        i32::try_from(default_max).unwrap_or(i32::MAX),
    )
    .fetch_all(conn)
    .await
    .map_err(Into::into)
}
