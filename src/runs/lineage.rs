//! What continue, retry-from-model-call and resume of agent loop runs read from a source
//! run before admitting the new one (see [`runs::admit`](crate::runs::admit)).

use sqlx::PgConnection;

use crate::artifacts::ArtifactRecord;
use crate::db::Result;
use crate::domain::Scope;

/// The name (and kind) of the artifact holding an agent loop run's conversation.
pub const CONVERSATION_ARTIFACT: &str = "agent_conversation";

/// The run's `agent_conversation` artifact, if it wrote one.
pub async fn conversation_artifact(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
) -> Result<Option<ArtifactRecord>> {
    let artifact = sqlx::query_as(
        "SELECT id, run_id, task_id, media_job_id, name, kind, content_type, size_bytes,
                truncated, status, storage, created_at, updated_at
         FROM artifacts
         WHERE workspace_id = $1 AND run_id = $2 AND name = $3 AND kind = $3",
    )
    .bind(scope.workspace())
    .bind(run_id)
    .bind(CONVERSATION_ARTIFACT)
    .fetch_optional(conn)
    .await?;
    Ok(artifact)
}
