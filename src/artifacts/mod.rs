//! Artifacts: metadata rows. Their bytes are appended and read through
//! [`ContentStore`](crate::artifacts::content::ContentStore), which keeps them in Postgres or in an
//! object store; metadata stays in Postgres either way.

pub mod content;

use sqlx::PgConnection;

use crate::db::{Result, StoreError};
use crate::domain::{EventType, Scope, new_id};
use crate::events;
use crate::events::{NewEvent, Subject};

pub(crate) use keel_api_types::ArtifactRecord;
use keel_api_types::{ArtifactKind, ArtifactStatus};

/// `query_as!` of [`ArtifactRecord`]s, or of `$record:`, a row of their columns and more:
/// `$before` (up to its `SELECT` or `RETURNING`; with `$record:`, literals joined with `+`),
/// then the artifact's columns (`kind` and `status` as an [`ArtifactKind`] and an
/// [`ArtifactStatus`]), then `$after` (its `FROM …`, or nothing).
macro_rules! query_artifacts {
    ($record:ident: $before:literal $(+ $more:literal)*, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            $record,
            $before
                $(+ $more)*
                + r#" id, run_id, task_id, media_job_id, name, kind AS "kind: ArtifactKind",
                      content_type, size_bytes, truncated, status AS "status: ArtifactStatus",
                      storage, created_at, updated_at "#
                + $after
            $(, $arg)*
        )
    };
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        query_artifacts!(ArtifactRecord: $before, $after $(, $arg)*)
    };
}
pub(crate) use query_artifacts;

/// An artifact a writer names, with the id it is created under if it does not exist yet.
pub(crate) struct NewArtifact<'a> {
    pub(crate) id: &'a str,
    pub(crate) owner: Subject<'a>,
    pub(crate) name: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) content_type: &'a str,
    /// `complete` when the writer already closed it (it was held back until then).
    pub(crate) closed: bool,
}

/// An upserted artifact, and whether this call created it.
pub(crate) struct Upserted {
    pub(crate) artifact: ArtifactRecord,
    pub(crate) created: bool,
}

impl NewArtifact<'_> {
    /// The status it is stored with: `complete` once closed, else `writing`.
    pub(crate) fn status(&self) -> &'static str {
        if self.closed { "complete" } else { "writing" }
    }
}

/// An upserted artifact as a statement that writes several returns it, in JSON.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct UpsertedJson {
    artifact: ArtifactRecord,
    created: bool,
}

impl From<UpsertedJson> for Upserted {
    fn from(json: UpsertedJson) -> Upserted {
        Upserted {
            artifact: json.artifact,
            created: json.created,
        }
    }
}

/// The row [`upsert`] returns: the artifact's columns and `created`.
struct UpsertedRow {
    id: String,
    run_id: Option<String>,
    task_id: Option<String>,
    media_job_id: Option<String>,
    name: String,
    kind: ArtifactKind,
    content_type: String,
    size_bytes: i64,
    truncated: bool,
    status: ArtifactStatus,
    storage: String,
    created_at: chrono::DateTime<chrono::Utc>,
    updated_at: chrono::DateTime<chrono::Utc>,
    created: bool,
}

impl From<UpsertedRow> for Upserted {
    fn from(row: UpsertedRow) -> Upserted {
        Upserted {
            artifact: ArtifactRecord {
                id: row.id,
                run_id: row.run_id,
                task_id: row.task_id,
                media_job_id: row.media_job_id,
                name: row.name,
                kind: row.kind,
                content_type: row.content_type,
                size_bytes: row.size_bytes,
                truncated: row.truncated,
                status: row.status,
                storage: row.storage,
                created_at: row.created_at,
                updated_at: row.updated_at,
            },
            created: row.created,
        }
    }
}

/// Opens an artifact for writing, with its `artifact.created` event when it is new.
pub async fn open(
    conn: &mut PgConnection,
    scope: &Scope,
    owner: Subject<'_>,
    name: &str,
    kind: &str,
    content_type: &str,
) -> Result<ArtifactRecord> {
    let id = new_id("art");
    let artifact = NewArtifact {
        id: &id,
        owner,
        name,
        kind,
        content_type,
        closed: false,
    };
    let upserted = upsert(conn, scope, &artifact).await?;
    if let Some(event) = created_event(owner, &upserted) {
        events::append(conn, scope, &[event]).await?;
    }
    Ok(upserted.artifact)
}

/// Creates an artifact, or, for an attempt that takes over from a lost one, reopens the
/// one of the same owner and name (its writes append after what was already written).
pub(crate) async fn upsert(
    conn: &mut PgConnection,
    scope: &Scope,
    artifact: &NewArtifact<'_>,
) -> Result<Upserted> {
    let (task_id, run_id, media_job_id) = artifact.owner.columns();
    let status = artifact.status();
    // The statement of either owner, which differ only in the owner's key `$key` their
    // conflict names. `xmax = 0`: the row version is this statement's insert, not an
    // update of an old row.
    macro_rules! upsert {
        ($key:literal) => {
            query_artifacts!(
                UpsertedRow:
                "INSERT INTO artifacts (id, run_id, task_id, media_job_id, name, kind, content_type,
                                        status, workspace_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 ON CONFLICT "
                    + $key
                    + " DO UPDATE SET status = EXCLUDED.status, updated_at = now()
                          WHERE artifacts.workspace_id = EXCLUDED.workspace_id
                        RETURNING",
                r#", xmax = 0 AS "created!""#,
                artifact.id,
                run_id,
                task_id,
                media_job_id,
                artifact.name,
                artifact.kind,
                artifact.content_type,
                status,
                scope.workspace(),
            )
            .fetch_optional(conn)
            .await?
        };
    }
    let row = match artifact.owner {
        Subject::Run { .. } => upsert!("(run_id, name)"),
        // The key is a partial index (media artifacts only), which the conflict names by
        // its predicate too; the full key it replaces, kept one release longer (migration
        // 0039), matches the same conflict.
        Subject::MediaJob(_) => upsert!("(media_job_id, name) WHERE media_job_id IS NOT NULL"),
    };
    let upserted = row.ok_or(StoreError::NotFound("artifact"))?.into();
    Ok(upserted)
}

/// `artifact.created` of an artifact [`upsert`] created; None for a reopened one.
pub(crate) fn created_event<'a>(owner: Subject<'a>, upserted: &Upserted) -> Option<NewEvent<'a>> {
    let artifact = &upserted.artifact;
    upserted.created.then(|| NewEvent {
        subject: owner,
        event_type: EventType::ArtifactCreated,
        data: serde_json::json!({ "artifact_id": artifact.id, "name": artifact.name,
                                  "kind": artifact.kind }),
    })
}

pub async fn close(conn: &mut PgConnection, scope: &Scope, artifact_id: &str) -> Result<()> {
    sqlx::query!(
        "UPDATE artifacts SET status = 'complete', updated_at = now()
         WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        artifact_id,
    )
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
    let (task_id, run_id, media_job_id) = owner.columns();
    query_artifacts!(
        "SELECT",
        "FROM artifacts
         WHERE workspace_id = $1 AND id = $2
           AND run_id IS NOT DISTINCT FROM $3 AND task_id IS NOT DISTINCT FROM $4
           AND media_job_id IS NOT DISTINCT FROM $5",
        scope.workspace(),
        artifact_id,
        run_id,
        task_id,
        media_job_id,
    )
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
    let (_, owner_id) = owner.key();
    let rows = match owner {
        Subject::Run { .. } => {
            query_artifacts!(
                "SELECT",
                "FROM artifacts
                 WHERE workspace_id = $4 AND run_id = $1 AND ($2::text IS NULL OR id > $2)
                 ORDER BY id LIMIT $3",
                owner_id,
                after,
                limit,
                scope.workspace(),
            )
            .fetch_all(conn)
            .await?
        }
        Subject::MediaJob(_) => {
            query_artifacts!(
                "SELECT",
                "FROM artifacts
                 WHERE workspace_id = $4 AND media_job_id = $1 AND ($2::text IS NULL OR id > $2)
                 ORDER BY id LIMIT $3",
                owner_id,
                after,
                limit,
                scope.workspace(),
            )
            .fetch_all(conn)
            .await?
        }
    };
    Ok(rows)
}

/// A run's last `limit` artifacts (by id: in the order they were created).
pub async fn latest_of_run(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    limit: i64,
) -> Result<Vec<ArtifactRecord>> {
    let mut rows = query_artifacts!(
        "SELECT",
        "FROM artifacts WHERE workspace_id = $1 AND run_id = $2 ORDER BY id DESC LIMIT $3",
        scope.workspace(),
        run_id,
        limit,
    )
    .fetch_all(conn)
    .await?;
    rows.reverse();
    Ok(rows)
}

/// The artifacts of all a task's runs, oldest first; `after` is the id of the last artifact
/// of the previous page. Every id is greater than '', so the first page's bound is an
/// index bound (`artifacts_task`) as every later page's is.
pub async fn list_of_task(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<ArtifactRecord>> {
    let rows = query_artifacts!(
        "SELECT",
        "FROM artifacts
         WHERE workspace_id = $1 AND task_id = $2 AND id > $3
         ORDER BY id LIMIT $4",
        scope.workspace(),
        task_id,
        after.unwrap_or_default(),
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}
