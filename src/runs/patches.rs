//! Patch artifacts: one file's change by an agent tool (kind `patch`, content the
//! [`Patch`] JSON through the content store), and their `patch_status`: `applied` when a
//! tool wrote it, `proposed` when it only proposed it; then, through the API, `reverted`
//! (an applied patch's file restored to its `before`), `applied` (a proposal written) or
//! `discarded` (a proposal dropped). [`PatchAction::next`] decides every transition.

use std::path::PathBuf;

use keel_api_types::ErrorCode;
use keel_workers::agent::Patch;
use keel_workers::agent::tools::{self, RevertError};
use sqlx::{PgConnection, PgPool};

use crate::approvals::{self, Approver};
use crate::artifacts::content::ContentStore;
use crate::artifacts::{ArtifactRecord, query_artifacts};
use crate::db::{Result, StoreError};
use crate::domain::{EventType, Scope, new_id};
use crate::events::{NewEvent, Subject};
use crate::runs::RunRecord;
use crate::runs::job::workspace_dir;
use crate::tasks::{TaskRecord, WorkspaceRoots};
use keel_api_types::{ArtifactKind, ArtifactStatus, PatchStatus};

/// The content type of a patch artifact's bytes.
pub(crate) const CONTENT_TYPE: &str = "application/json";

/// Writes one patch artifact of a run, complete and `applied` (`proposed` for a proposal),
/// with `patch` as its content, in the caller's transaction. Events go last in a transaction, so the caller appends the
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
    let mut record = query_artifacts!(
        "INSERT INTO artifacts (id, run_id, task_id, name, kind, content_type, status,
                                patch_status, workspace_id)
         VALUES ($1, $2, $3, $4, 'patch', $5, 'complete', $7, $6)
         RETURNING",
        "",
        new_id("art"),
        run_id,
        task_id,
        name,
        CONTENT_TYPE,
        scope.workspace(),
        match patch.proposed {
            true => PatchStatus::Proposed.as_str(),
            false => PatchStatus::Applied.as_str(),
        },
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| match e {
        e if crate::db::violates(&e, "artifacts_run_id_name_key") => {
            StoreError::Conflict(format!("run {run_id} already has an artifact named {name}"))
        }
        e => e.into(),
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

/// A patch artifact's row: what lists and reverts need before reading its content.
#[derive(Debug, Clone)]
pub struct PatchRow {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) patch_status: String,
    pub(crate) created_at: chrono::DateTime<chrono::Utc>,
}

/// A page of a run's patch artifacts, in id (creation) order.
pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<PatchRow>> {
    // A patch artifact always has a `patch_status` (the table's check constraint).
    let rows = sqlx::query_as!(
        PatchRow,
        r#"SELECT id, name, patch_status AS "patch_status!", created_at FROM artifacts
           WHERE workspace_id = $1 AND run_id = $2 AND kind = 'patch'
             AND ($3::text IS NULL OR id > $3)
           ORDER BY id LIMIT $4"#,
        scope.workspace(),
        run_id,
        after,
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// One patch artifact of a run; with `lock`, its row is locked until the transaction ends.
pub async fn get(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    artifact_id: &str,
    lock: bool,
) -> Result<PatchRow> {
    // A patch artifact always has a `patch_status` (the table's check constraint).
    let row = if lock {
        sqlx::query_as!(
            PatchRow,
            r#"SELECT id, name, patch_status AS "patch_status!", created_at FROM artifacts
               WHERE workspace_id = $1 AND run_id = $2 AND id = $3 AND kind = 'patch'
               FOR UPDATE"#,
            scope.workspace(),
            run_id,
            artifact_id,
        )
        .fetch_optional(conn)
        .await?
    } else {
        sqlx::query_as!(
            PatchRow,
            r#"SELECT id, name, patch_status AS "patch_status!", created_at FROM artifacts
               WHERE workspace_id = $1 AND run_id = $2 AND id = $3 AND kind = 'patch'"#,
            scope.workspace(),
            run_id,
            artifact_id,
        )
        .fetch_optional(conn)
        .await?
    };
    row.ok_or(StoreError::NotFound("patch"))
}

/// The [`Patch`] a patch artifact holds.
pub(crate) async fn content(
    content: &ContentStore,
    pool: &sqlx::PgPool,
    artifact_id: &str,
) -> Result<Patch> {
    use futures_util::TryStreamExt;

    let chunks: Vec<bytes::Bytes> = content
        .stream(pool.clone(), artifact_id.to_string())
        .try_collect()
        .await?;
    serde_json::from_slice(&chunks.concat()).map_err(|e| {
        StoreError::Content(format!("patch artifact {artifact_id} cannot be read: {e}"))
    })
}

/// What an operator does with a patch through the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchAction {
    /// Restores an applied patch's `before`.
    Revert,
    /// Writes a proposed patch's `after`.
    Apply,
    /// Drops a proposal; the file is never touched.
    Discard,
}

impl PatchAction {
    /// The status a patch in `from` moves to, or why it cannot.
    pub(crate) fn next(self, from: PatchStatus) -> Result<PatchStatus, String> {
        use PatchStatus::*;
        match (self, from) {
            (PatchAction::Revert, Applied) => Ok(Reverted),
            (PatchAction::Apply, Proposed) => Ok(Applied),
            (PatchAction::Discard, Proposed) => Ok(Discarded),
            (PatchAction::Revert, Proposed) => Err("it is only proposed; discard it".into()),
            (PatchAction::Apply | PatchAction::Discard, Applied) => {
                Err("it is applied, not proposed; revert it".into())
            }
            (_, status) => Err(format!("it is {status}")),
        }
    }

    /// Whether it writes the run's workspace.
    pub(crate) fn writes(self) -> bool {
        self != PatchAction::Discard
    }

    fn event(self) -> EventType {
        match self {
            PatchAction::Revert => EventType::ToolFileReverted,
            PatchAction::Apply => EventType::ToolFileApplied,
            PatchAction::Discard => EventType::ToolFileDiscarded,
        }
    }
}

/// Moves a patch to `to` after `action`, with the action's `tool.file.*` event, in the
/// caller's transaction.
pub(crate) async fn mark(
    conn: &mut PgConnection,
    scope: &Scope,
    run: Subject<'_>,
    (artifact_id, path): (&str, &str),
    action: PatchAction,
    to: PatchStatus,
) -> Result<()> {
    sqlx::query!(
        "UPDATE artifacts SET patch_status = $3, updated_at = now()
         WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        artifact_id,
        to.as_str(),
    )
    .execute(&mut *conn)
    .await?;
    let event = NewEvent {
        subject: run,
        event_type: action.event(),
        data: serde_json::json!({ "artifact_id": artifact_id, "path": path }),
    };
    crate::events::append(conn, scope, &[event]).await
}

/// Who changes a patch and where its run's workspace is found: [`change`]'s setting.
pub(crate) struct PatchDesk<'a> {
    pub(crate) pool: &'a PgPool,
    pub(crate) content: &'a ContentStore,
    pub(crate) roots: &'a WorkspaceRoots,
    pub(crate) approver: Approver,
}

/// Carries out `action` on a patch of an ended run, for an approver other than the run's
/// requester (403 otherwise): the file written (for a revert or an apply) while the
/// patch's row is locked, so a concurrent change waits and then sees the new status; the
/// status and its event committed after. Returns the patch as it now stands.
pub(crate) async fn change(
    desk: &PatchDesk<'_>,
    scope: &Scope,
    (task_id, run_id, artifact_id): (&str, &str, &str),
    action: PatchAction,
) -> Result<(PatchRow, Patch)> {
    let mut tx = desk.pool.begin().await?;
    let run = crate::runs::get(&mut tx, scope, task_id, run_id).await?;
    let what = "apply, revert or discard its patches";
    approvals::check_approver(run.requested_by.as_deref(), &desk.approver, what)?;
    let task = crate::tasks::get(&mut tx, scope, task_id).await?;
    let mut row = get(&mut tx, scope, run_id, artifact_id, true).await?;
    if !run.status().is_terminal() {
        return Err(StoreError::conflict_next(
            format!(
                "run {run_id} is {}; change its patches once it has ended",
                run.status
            ),
            format!("Wait for the run to end (keel runs watch {run_id}), then try again."),
        ));
    }
    let from = PatchStatus::parse(&row.patch_status).ok_or_else(|| {
        let unknown = format!("patch {artifact_id} has status {}", row.patch_status);
        StoreError::Database(sqlx::Error::Decode(unknown.into()))
    })?;
    let to = action.next(from).map_err(|why| {
        StoreError::conflict_next(
            format!("patch {artifact_id}: {why}"),
            format!("See each patch's status: keel runs patches list {run_id}."),
        )
    })?;
    let patch = content(desk.content, desk.pool, &row.id).await?;
    if action.writes() {
        write(run_workspace(desk.roots, &task, &run)?, &patch, action).await?;
    }
    let subject = Subject::Run { task_id, run_id };
    let changed = (row.id.as_str(), patch.path.as_str());
    mark(&mut tx, scope, subject, changed, action, to).await?;
    tx.commit().await?;
    row.patch_status = to.to_string();
    Ok((row, patch))
}

/// Applies or reverts `patch` in `dir`, on a blocking thread; 409 when the file drifted.
async fn write(dir: PathBuf, patch: &Patch, action: PatchAction) -> Result<()> {
    let changing = patch.clone();
    let write = move || match action {
        PatchAction::Apply => tools::apply(&dir, &changing),
        _ => tools::revert(&dir, &changing),
    };
    let written = tokio::task::spawn_blocking(write)
        .await
        .unwrap_or_else(|panicked| std::panic::resume_unwind(panicked.into_panic()));
    written.map_err(|e| match e {
        RevertError::Drift(message) | RevertError::Refused(message) => {
            StoreError::Conflict(message)
        }
    })
}

/// The run's workspace directory, when this process reaches it.
fn run_workspace(roots: &WorkspaceRoots, task: &TaskRecord, run: &RunRecord) -> Result<PathBuf> {
    let unavailable = |why: String| StoreError::Refused {
        code: ErrorCode::WorkspaceUnavailable,
        message: format!(
            "run {}'s workspace is not reachable from this API process ({why}); change its \
             files where the worker's data directory is shared (keel serve, or one \
             KEEL_DATA_DIR)",
            run.id
        ),
    };
    let data_dir = roots
        .data_dir()
        .ok_or_else(|| unavailable("no data directory is configured".into()))?;
    let dir = workspace_dir(roots, data_dir, task, run).map_err(unavailable)?;
    dir.canonicalize()
        .ok()
        .filter(|d| d.is_dir())
        .ok_or_else(|| unavailable(format!("{} does not exist here", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_moves_only_along_its_transitions() {
        use PatchStatus::*;
        assert_eq!(PatchAction::Revert.next(Applied), Ok(Reverted));
        assert_eq!(PatchAction::Apply.next(Proposed), Ok(Applied));
        assert_eq!(PatchAction::Discard.next(Proposed), Ok(Discarded));
        for (action, from) in [
            (PatchAction::Revert, Proposed),
            (PatchAction::Revert, Reverted),
            (PatchAction::Apply, Applied),
            (PatchAction::Apply, Discarded),
            (PatchAction::Discard, Reverted),
        ] {
            assert!(action.next(from).is_err(), "{action:?} from {from}");
        }
    }
}
