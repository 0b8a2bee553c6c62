//! Ephemeral workspace retention: which runs' workspaces may go, and marking them gone
//! (the sweep itself, on a worker's disk, is `scheduler::workspaces`).
//!
//! A run's workspace may go once no run working in it (the run itself, or a run resumed
//! from it) is active or ended less than the retention ago.

use std::time::Duration;

use sqlx::PgConnection;

use crate::db::Result;

fn retention_ms(retention: Duration) -> f64 {
    retention.as_millis() as f64
}

/// Of these run ids, those whose workspace retention ended, in every workspace.
pub(crate) async fn expired(
    conn: &mut PgConnection,
    run_ids: &[String],
    retention: Duration,
) -> Result<Vec<String>> {
    let expired = sqlx::query_scalar!(
        "SELECT o.id FROM runs o
         WHERE o.id = ANY($1) AND o.workspace_removed_at IS NULL
           AND NOT EXISTS (
               SELECT 1 FROM runs r
               WHERE r.task_id = o.task_id AND (r.id = o.id OR r.workspace_run_id = o.id)
                 AND (r.finished_at IS NULL
                      OR r.finished_at > now() - make_interval(secs => $2::float8 / 1000)))",
        run_ids,
        retention_ms(retention),
    )
    .fetch_all(conn)
    .await?;
    Ok(expired)
}

/// Of these task ids, those of tasks that no longer exist, in every workspace.
pub(crate) async fn deleted_tasks(
    conn: &mut PgConnection,
    task_ids: &[String],
) -> Result<Vec<String>> {
    let deleted = sqlx::query_scalar!(
        r#"SELECT id AS "id!" FROM unnest($1::text[]) AS ids (id)
           WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = ids.id)"#,
        task_ids,
    )
    .fetch_all(conn)
    .await?;
    Ok(deleted)
}

/// Locks the task of the run, the lock a resume admission takes; false when another
/// replica or an admission holds it.
pub(crate) async fn lock_task_of(conn: &mut PgConnection, run_id: &str) -> Result<bool> {
    let locked = sqlx::query_scalar!(
        "SELECT t.id FROM tasks t JOIN runs o ON o.task_id = t.id WHERE o.id = $1
         FOR UPDATE OF t SKIP LOCKED",
        run_id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(locked.is_some())
}

/// Marks the run's workspace removed if its retention still ended (checked again under
/// the task's lock: a resume may have made it live again); false otherwise.
pub(crate) async fn mark_removed(
    conn: &mut PgConnection,
    run_id: &str,
    retention: Duration,
) -> Result<bool> {
    let marked = sqlx::query_scalar!(
        "UPDATE runs o SET workspace_removed_at = now()
         WHERE o.id = $1 AND o.workspace_removed_at IS NULL
           AND NOT EXISTS (
               SELECT 1 FROM runs r
               WHERE r.task_id = o.task_id AND (r.id = o.id OR r.workspace_run_id = o.id)
                 AND (r.finished_at IS NULL
                      OR r.finished_at > now() - make_interval(secs => $2::float8 / 1000)))
         RETURNING o.id",
        run_id,
        retention_ms(retention),
    )
    .fetch_optional(conn)
    .await?;
    Ok(marked.is_some())
}
