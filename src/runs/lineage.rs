//! An agent loop run's conversation: written as its `agent_conversation` artifact when an
//! attempt ends, and what continue, retry-from-model-call and resume read from a source
//! run before admitting the new one (see [`runs::admit`](crate::runs::admit)).

use sqlx::PgConnection;

use crate::artifacts::content::ContentStore;
use crate::artifacts::{self, NewArtifact, Upserted};
use crate::artifacts::{ArtifactRecord, query_artifacts};
use crate::db::Result;
use crate::db::StoreError;
use crate::domain::Scope;
use crate::domain::new_id;
use crate::events::Subject;
use keel_api_types::{ArtifactKind, ArtifactStatus};

/// The name (and kind) of the artifact holding an agent loop run's conversation.
pub(crate) const CONVERSATION_ARTIFACT: &str = "agent_conversation";

/// The run's `agent_conversation` artifact, if it wrote one.
pub(crate) async fn conversation_artifact(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
) -> Result<Option<ArtifactRecord>> {
    let artifact = query_artifacts!(
        "SELECT",
        "FROM artifacts WHERE workspace_id = $1 AND run_id = $2 AND name = $3 AND kind = $3",
        scope.workspace(),
        run_id,
        CONVERSATION_ARTIFACT,
    )
    .fetch_optional(conn)
    .await?;
    Ok(artifact)
}

/// The conversation an attempt ended with, for its end transaction.
pub(crate) struct Conversation {
    pub(crate) content: ContentStore,
    pub(crate) bytes: Vec<u8>,
    /// The model's answer, when it ended the conversation.
    pub(crate) answer: Option<String>,
}

/// Replaces the run's `agent_conversation` artifact with `conversation`, in the caller's
/// transaction; the caller appends its `artifact.created` event.
pub(crate) async fn write_conversation(
    conn: &mut PgConnection,
    scope: &Scope,
    owner: Subject<'_>,
    conversation: &Conversation,
) -> Result<Upserted, StoreError> {
    let Subject::Run { run_id, .. } = owner else {
        return Err(StoreError::Conflict(
            "a conversation belongs to a run".into(),
        ));
    };
    // Its chunks go with it (ON DELETE CASCADE): the content is replaced, not appended.
    sqlx::query!(
        "DELETE FROM artifacts WHERE workspace_id = $1 AND run_id = $2 AND name = $3",
        scope.workspace(),
        run_id,
        CONVERSATION_ARTIFACT,
    )
    .execute(&mut *conn)
    .await?;
    let id = new_id("art");
    let artifact = NewArtifact {
        id: &id,
        owner,
        name: CONVERSATION_ARTIFACT,
        kind: CONVERSATION_ARTIFACT,
        content_type: "application/json",
        closed: true,
    };
    let mut upserted = artifacts::upsert(conn, scope, &artifact).await?;
    let bytes = &conversation.bytes;
    // No cap: a cut JSON document could not be read back by resume and continue.
    conversation
        .content
        .append(conn, scope, &id, bytes, i64::MAX)
        .await?;
    upserted.artifact.size_bytes = bytes.len() as i64;
    Ok(upserted)
}
