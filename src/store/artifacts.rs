//! Artifacts: metadata rows. Their bytes are appended and read through
//! [`ContentStore`](super::content::ContentStore), which keeps them in Postgres or in an
//! object store; metadata stays in Postgres either way.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::events::{self, NewEvent, Subject};
use super::{Result, StoreError};
use crate::domain::{EventType, Scope, new_id};

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct ArtifactRecord {
    pub id: String,
    /// The run that wrote it and its task (null for a media job's artifact).
    pub run_id: Option<String>,
    pub task_id: Option<String>,
    /// The media job that produced it (null for a run's artifact).
    pub media_job_id: Option<String>,
    pub name: String,
    pub kind: String,
    pub content_type: String,
    pub size_bytes: i64,
    pub truncated: bool,
    pub status: String,
    pub storage: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const ARTIFACT_COLUMNS: &str =
    "id, run_id, task_id, media_job_id, name, kind, content_type, size_bytes, truncated,
    status, storage, created_at, updated_at";

/// Opens an artifact for writing. An attempt that takes over from a lost one reopens the
/// same artifact (same owner, same name) and appends after what was already written.
pub async fn open(
    conn: &mut PgConnection,
    scope: &Scope,
    owner: Subject<'_>,
    name: &str,
    kind: &str,
    content_type: &str,
) -> Result<ArtifactRecord> {
    let (task_id, run_id, media_job_id) = owner.columns();
    let (column, owner_id) = owner.key();
    let created: Option<ArtifactRecord> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO artifacts (id, run_id, task_id, media_job_id, name, kind, content_type, status,
                                workspace_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'writing', $8)
         ON CONFLICT ({column}, name) DO NOTHING RETURNING {ARTIFACT_COLUMNS}"
    )))
    .bind(new_id("art"))
    .bind(run_id)
    .bind(task_id)
    .bind(media_job_id)
    .bind(name)
    .bind(kind)
    .bind(content_type)
    .bind(scope.workspace())
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(artifact) = created {
        let data = serde_json::json!({ "artifact_id": artifact.id, "name": name, "kind": kind });
        let event = NewEvent {
            subject: owner,
            event_type: EventType::ArtifactCreated,
            data,
        };
        events::append(conn, scope, &[event]).await?;
        return Ok(artifact);
    }
    let reopened = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE artifacts SET status = 'writing', updated_at = now()
         WHERE workspace_id = $3 AND {column} = $1 AND name = $2 RETURNING {ARTIFACT_COLUMNS}"
    )))
    .bind(owner_id)
    .bind(name)
    .bind(scope.workspace())
    .fetch_one(&mut *conn)
    .await?;
    Ok(reopened)
}

pub async fn close(conn: &mut PgConnection, scope: &Scope, artifact_id: &str) -> Result<()> {
    sqlx::query(
        "UPDATE artifacts SET status = 'complete', updated_at = now()
         WHERE workspace_id = $1 AND id = $2",
    )
    .bind(scope.workspace())
    .bind(artifact_id)
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn get(
    conn: &mut PgConnection,
    scope: &Scope,
    owner: Subject<'_>,
    artifact_id: &str,
) -> Result<ArtifactRecord> {
    let (column, owner_id) = owner.key();
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {ARTIFACT_COLUMNS} FROM artifacts
         WHERE workspace_id = $3 AND {column} = $1 AND id = $2"
    )))
    .bind(owner_id)
    .bind(artifact_id)
    .bind(scope.workspace())
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("artifact"))
}

pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    owner: Subject<'_>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<ArtifactRecord>> {
    let (column, owner_id) = owner.key();
    let rows = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {ARTIFACT_COLUMNS} FROM artifacts
         WHERE workspace_id = $4 AND {column} = $1 AND ($2::text IS NULL OR id > $2)
         ORDER BY id LIMIT $3"
    )))
    .bind(owner_id)
    .bind(after)
    .bind(limit)
    .bind(scope.workspace())
    .fetch_all(conn)
    .await?;
    Ok(rows)
}
