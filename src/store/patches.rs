//! Patch artifacts: one file's change by an agent tool (kind `patch`, content the
//! [`Patch`] JSON through the content store), and their `patch_status` (`applied` when a
//! tool wrote it, `reverted` once the API restored the file's `before`).

use keel_workers::agent::Patch;
use sqlx::PgConnection;

use super::artifacts::ArtifactRecord;
use super::content::ContentStore;
use super::events::{NewEvent, Subject};
use super::{Result, StoreError};
use crate::domain::{EventType, Scope, new_id};

/// The content type of a patch artifact's bytes.
pub const CONTENT_TYPE: &str = "application/json";

/// Writes one patch artifact of a run, complete and `applied`, with `patch` as its content,
/// in the caller's transaction. Events go last in a transaction, so the caller appends the
/// artifact's [`created_event`] itself (with the rest of its events).
pub async fn insert_patch(
    conn: &mut PgConnection,
    content: &ContentStore,
    scope: &Scope,
    run: Subject<'_>,
    name: &str,
    patch: &Patch,
) -> Result<ArtifactRecord> {
    let Subject::Run { task_id, run_id } = run else {
        return Err(StoreError::Conflict("a patch belongs to a run".into()));
    };
    let mut record: ArtifactRecord = sqlx::query_as(
        "INSERT INTO artifacts (id, run_id, task_id, name, kind, content_type, status,
                                patch_status, workspace_id)
         VALUES ($1, $2, $3, $4, 'patch', $5, 'complete', 'applied', $6)
         RETURNING id, run_id, task_id, media_job_id, name, kind, content_type, size_bytes,
                   truncated, status, storage, created_at, updated_at",
    )
    .bind(new_id("art"))
    .bind(run_id)
    .bind(task_id)
    .bind(name)
    .bind(CONTENT_TYPE)
    .bind(scope.workspace())
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| match e {
        e if super::violates(&e, "artifacts_run_id_name_key") => {
            StoreError::Conflict(format!("run {run_id} already has an artifact named {name}"))
        }
        e => StoreError::Database(e),
    })?;
    let bytes = serde_json::to_vec(patch).expect("a Patch serializes");
    // No cap: the tools only change text files of bounded size, and a cut JSON document
    // could not be read back.
    content
        .append(conn, scope, &record.id, &bytes, i64::MAX)
        .await?;
    record.size_bytes = bytes.len() as i64;
    record.storage = content.name().to_string();
    Ok(record)
}

/// The `artifact.created` event of a patch [`insert_patch`] wrote.
pub fn created_event<'a>(run: Subject<'a>, record: &ArtifactRecord) -> NewEvent<'a> {
    NewEvent {
        subject: run,
        event_type: EventType::ArtifactCreated,
        data: serde_json::json!({ "artifact_id": record.id, "name": record.name,
                                  "kind": record.kind }),
    }
}
