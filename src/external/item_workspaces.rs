//! The rows behind external work items' workspaces (`workspace.root`): which items are
//! being prepared or wait to start, which terminal items still have a directory, the
//! hooks' output, and the lock that keeps two processes out of one item's directory.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgConnection;

use crate::db::Result;
use crate::domain::Scope;
use crate::external::{ItemRecord, item_record, query_items};
use keel_api_types::ItemState;

/// Marks an item `workspace_preparing` in `path` (the error cleared).
pub(crate) async fn begin_preparation(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    path: &str,
) -> Result<ItemRecord> {
    let row = query_items!(
        "UPDATE external_work_items
         SET state = 'workspace_preparing', workspace_path = $3, last_error_code = NULL,
             last_error = NULL, updated_at = now()
         WHERE workspace_id = $1 AND id = $2
         RETURNING",
        "",
        scope.workspace(),
        id,
        path,
    )
    .fetch_one(conn)
    .await?;
    Ok(row)
}

/// Who holds a directory an item is about to be given.
pub(crate) struct Held {
    /// The directory the item's subject (its earlier versions) already has.
    pub(crate) own: Option<String>,
    /// Whether another subject of the workspace has `candidate`.
    pub(crate) by_another: bool,
}

/// The directory the item's subject has, and whether another subject has `candidate`.
pub(crate) async fn directory_held(
    conn: &mut PgConnection,
    scope: &Scope,
    item: &ItemRecord,
    candidate: &str,
) -> Result<Held> {
    let row = sqlx::query!(
        r#"SELECT (SELECT workspace_path FROM external_work_items
                   WHERE workspace_id = $1 AND source_id = $2 AND identifier = $3
                     AND workspace_path IS NOT NULL
                   ORDER BY id DESC LIMIT 1) AS own,
                  EXISTS (SELECT 1 FROM external_work_items
                          WHERE workspace_id = $1 AND workspace_path = $4
                            AND (source_id <> $2 OR identifier <> $3)) AS "by_another!""#,
        scope.workspace(),
        &item.source_id,
        &item.identifier,
        candidate,
    )
    .fetch_one(conn)
    .await?;
    Ok(Held {
        own: row.own,
        by_another: row.by_another,
    })
}

/// Keeps what a hook printed on the item, under the hook's name.
pub(crate) async fn record_hook(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    hook: &str,
    output: &impl Serialize,
) -> Result<()> {
    let output = serde_json::to_value(output).expect("a hook's output serializes");
    sqlx::query!(
        "UPDATE external_work_items
         SET hook_output = COALESCE(hook_output, '{}') || jsonb_build_object($3::text, $4::jsonb),
             updated_at = now()
         WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
        hook,
        output,
    )
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn get(conn: &mut PgConnection, scope: &Scope, id: &str) -> Result<ItemRecord> {
    let row = query_items!(
        "SELECT",
        "FROM external_work_items WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
    )
    .fetch_one(conn)
    .await?;
    Ok(row)
}

/// Whether `id` is the newest version of its subject.
pub(crate) async fn is_newest(
    conn: &mut PgConnection,
    scope: &Scope,
    item: &ItemRecord,
) -> Result<bool> {
    let newer = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM external_work_items
                          WHERE workspace_id = $1 AND source_id = $2 AND identifier = $3
                            AND id > $4) AS "exists!""#,
        scope.workspace(),
        &item.source_id,
        &item.identifier,
        &item.id,
    )
    .fetch_one(conn)
    .await?;
    Ok(!newer)
}

/// Items whose preparation began or ended without their run starting (a process that
/// stopped in between, a slot taken meanwhile): the newest version of each subject, oldest
/// first.
pub(crate) async fn unstarted(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
    limit: u32,
) -> Result<Vec<ItemRecord>> {
    // The columns unqualified are `i`'s: the subquery's `n` is not in the select list's scope.
    let rows = query_items!(
        "SELECT",
        "FROM external_work_items i
         WHERE i.workspace_id = $1 AND i.source_id = $2
           AND i.state IN ('workspace_preparing', 'ready')
           AND NOT EXISTS (SELECT 1 FROM external_work_items n
                           WHERE n.workspace_id = i.workspace_id
                             AND n.source_id = i.source_id
                             AND n.identifier = i.identifier AND n.id > i.id)
         ORDER BY i.id LIMIT $3",
        scope.workspace(),
        source_id,
        i64::from(limit),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// A subject whose newest version is terminal and which still has a workspace.
#[derive(Debug, Clone)]
pub(crate) struct Removal {
    pub(crate) item: ItemRecord,
    pub(crate) workspace_id: String,
    pub(crate) directory: String,
}

/// Terminal items whose subject still has a workspace, in every workspace, oldest first
/// (the workers' maintenance removes them): terminal for `settled` at least, and with no
/// version's run still active. A run cancelled with its item has its worker told at once,
/// and stops at the latest when that worker's lease lapses: `settled` is longer, so no
/// process of the subject's works in the directory when it goes (Symphony stops the agent
/// before it cleans the workspace).
pub(crate) async fn to_remove(
    conn: &mut PgConnection,
    limit: u32,
    settled: Duration,
) -> Result<Vec<Removal>> {
    // From the few subjects with a workspace (a partial index), to their newest version.
    let rows = sqlx::query!(
        r#"SELECT newest.id, newest.workspace_id, newest.source_id, newest.idempotency_key,
                  newest.kind, newest.identifier, newest.tracker_state,
                  newest.state AS "state: ItemState", newest.issue, newest.prompt,
                  newest.task_id, newest.run_id, newest.last_error_code, newest.last_error,
                  newest.workspace_path, newest.hook_output, newest.created_at,
                  newest.updated_at, w.workspace_path AS "directory!"
           FROM (SELECT DISTINCT ON (workspace_id, source_id, identifier)
                        workspace_id, source_id, identifier, workspace_path
                 FROM external_work_items
                 WHERE workspace_path IS NOT NULL
                 ORDER BY workspace_id, source_id, identifier) w
           CROSS JOIN LATERAL (
               SELECT * FROM external_work_items n
               WHERE n.workspace_id = w.workspace_id AND n.source_id = w.source_id
                 AND n.identifier = w.identifier
               ORDER BY n.id DESC LIMIT 1
           ) newest
           WHERE newest.state = 'terminal'
             AND newest.updated_at < now() - $2::bigint * interval '1 millisecond'
             AND NOT EXISTS (
                 SELECT 1 FROM external_work_items v
                 JOIN runs r ON r.workspace_id = v.workspace_id AND r.id = v.run_id
                 WHERE v.workspace_id = w.workspace_id AND v.source_id = w.source_id
                   AND v.identifier = w.identifier
                   AND r.status IN ('queued', 'running', 'awaiting_approval'))
           ORDER BY newest.id LIMIT $1"#,
        i64::from(limit),
        i64::try_from(settled.as_millis()).unwrap_or(i64::MAX),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| Removal {
            item: item_record!(row),
            workspace_id: row.workspace_id,
            directory: row.directory,
        })
        .collect())
}

/// Forgets a subject's workspace, once removed.
pub(crate) async fn clear(conn: &mut PgConnection, scope: &Scope, item: &ItemRecord) -> Result<()> {
    sqlx::query!(
        "UPDATE external_work_items SET workspace_path = NULL, updated_at = now()
         WHERE workspace_id = $1 AND source_id = $2 AND identifier = $3
           AND workspace_path IS NOT NULL",
        scope.workspace(),
        &item.source_id,
        &item.identifier,
    )
    .execute(conn)
    .await?;
    Ok(())
}

fn lock_key(scope: &Scope, item: &ItemRecord) -> String {
    format!(
        "external_work_workspace:{}:{}:{}",
        scope.workspace(),
        item.source_id,
        item.identifier
    )
}

/// Takes the item's workspace lock for the session, if no other process holds it.
/// `before_remove` runs for up to `hooks.timeout_ms`, longer than a transaction may stay
/// idle, so this is a session lock: the caller releases it by closing the connection, as
/// the death of its process does, and never hands the connection back to the pool.
pub(crate) async fn try_lock(
    conn: &mut PgConnection,
    scope: &Scope,
    item: &ItemRecord,
) -> Result<bool> {
    crate::db::try_session_lock(conn, &lock_key(scope, item)).await
}
