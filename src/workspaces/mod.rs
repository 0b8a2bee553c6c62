//! What an operator sets per workspace: its concurrency limit, which the fair claim reads
//! (`queue::fair`).

use sqlx::PgConnection;

pub(crate) use keel_api_types::WorkspaceLimits;

use crate::db::Result;
use crate::domain::{Actor, Scope};

/// The workspace's limits (the workers' default when no operator set them).
pub(crate) async fn limits(conn: &mut PgConnection, scope: &Scope) -> Result<WorkspaceLimits> {
    let row = sqlx::query_as!(
        WorkspaceLimits,
        r#"SELECT workspace_id, max_concurrent, updated_at AS "updated_at?",
                  updated_by AS "updated_by?"
           FROM workspace_limits WHERE workspace_id = $1"#,
        scope.workspace(),
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.unwrap_or_else(|| WorkspaceLimits {
        workspace_id: scope.workspace().to_string(),
        max_concurrent: None,
        updated_at: None,
        updated_by: None,
    }))
}

/// Sets the workspace's limit (None: back to the workers' default).
pub(crate) async fn set_limits(
    conn: &mut PgConnection,
    scope: &Scope,
    max_concurrent: Option<i32>,
    actor: &Actor,
) -> Result<WorkspaceLimits> {
    Ok(sqlx::query_as!(
        WorkspaceLimits,
        r#"INSERT INTO workspace_limits (workspace_id, max_concurrent, updated_by)
           VALUES ($1, $2, $3)
           ON CONFLICT (workspace_id) DO UPDATE
           SET max_concurrent = EXCLUDED.max_concurrent, updated_by = EXCLUDED.updated_by,
               updated_at = now()
           RETURNING workspace_id, max_concurrent, updated_at AS "updated_at?",
                     updated_by AS "updated_by?""#,
        scope.workspace(),
        max_concurrent,
        actor.to_string(),
    )
    .fetch_one(conn)
    .await?)
}
