//! A run's patches: the file changes its agent tools made (patch artifacts), and their
//! revert. A revert writes the run's workspace, so it works only where this API process
//! shares the worker's data directory (`keel serve`, or one `KEEL_DATA_DIR` on a shared
//! volume); elsewhere it answers 409 `workspace_unavailable`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use keel_api_types::ErrorCode;
use keel_api_types::{PatchDetail, PatchSummary};
use keel_workers::agent::Patch;
use keel_workers::agent::tools::{self, RevertError};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::ApiQuery;
use crate::api::{
    ApiError, AppState, ListEnvelope, ObjectEnvelope, PageQuery, list, object as envelope,
    page_limit,
};
use crate::domain::Caller;
use crate::events::Subject;
use crate::runs::job::workspace_dir;
use crate::runs::patches;
use crate::runs::patches::PatchRow;
use crate::{runs, tasks};

type Result<T, E = ApiError> = std::result::Result<T, E>;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_patches))
        .routes(routes!(get_patch))
        .routes(routes!(revert_patch))
}

fn summary(row: PatchRow, patch: &Patch) -> PatchSummary {
    PatchSummary {
        id: row.id,
        name: row.name,
        path: patch.path.clone(),
        status: row.patch_status,
        created_at: row.created_at,
        before_bytes: patch.before.as_ref().map(String::len),
        after_bytes: patch.after.as_ref().map(String::len),
    }
}

/// Lists the patches a run's agent tools made, oldest first.
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}/patches", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path), PageQuery),
    responses((status = 200, description = "A page of patches", body = ListEnvelope<PatchSummary>)))]
async fn list_patches(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<ListEnvelope<PatchSummary>>> {
    let limit = page_limit(page.limit)?;
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    runs::get(&mut conn, scope, &task_id, &run_id).await?;
    let rows = patches::list(&mut conn, scope, &run_id, page.cursor.as_deref(), limit + 1).await?;
    drop(conn);
    let ListEnvelope {
        object,
        data: rows,
        has_more,
        next_cursor,
    } = list(rows, limit, |row| row.id.clone());
    let mut data = Vec::with_capacity(rows.len());
    for row in rows {
        let patch = patches::content(&state.content, &state.pool, &row.id).await?;
        data.push(summary(row, &patch));
    }
    Ok(Json(ListEnvelope {
        object,
        data,
        has_more,
        next_cursor,
    }))
}

/// Reads one patch, with the file's content before and after.
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path), ("artifact_id" = String, Path)),
    responses((status = 200, description = "The patch", body = ObjectEnvelope<PatchDetail>)))]
async fn get_patch(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id, artifact_id)): Path<(String, String, String)>,
) -> Result<Json<ObjectEnvelope<PatchDetail>>> {
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    runs::get(&mut conn, scope, &task_id, &run_id).await?;
    let row = patches::get(&mut conn, scope, &run_id, &artifact_id, false).await?;
    drop(conn);
    let patch = patches::content(&state.content, &state.pool, &row.id).await?;
    Ok(Json(envelope("task_patch", detail(row, patch))))
}

fn detail(row: PatchRow, patch: Patch) -> PatchDetail {
    PatchDetail {
        summary: summary(row, &patch),
        before: patch.before,
        after: patch.after,
    }
}

/// Restores the file's content from before the patch (removes a file the patch created),
/// only if the file is still exactly what the patch left; 409 `conflict` when it changed
/// since (the workspace is left untouched), when the patch was already reverted, or while
/// the run is active; 409 `workspace_unavailable` when this process cannot reach the run's
/// workspace (it does not share the worker's data directory).
#[utoipa::path(post, path = "/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}/revert", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path), ("artifact_id" = String, Path)),
    responses((status = 200, description = "The reverted patch", body = ObjectEnvelope<PatchDetail>),
              (status = 409, description = "Drift, already reverted, an active run, or no workspace here")))]
async fn revert_patch(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id, artifact_id)): Path<(String, String, String)>,
) -> Result<Json<ObjectEnvelope<PatchDetail>>> {
    let scope = &caller.scope;
    let mut tx = state.pool.begin().await?;
    let run = runs::get(&mut tx, scope, &task_id, &run_id).await?;
    let task = tasks::get(&mut tx, scope, &task_id).await?;
    let mut row = patches::get(&mut tx, scope, &run_id, &artifact_id, true).await?;
    if !run.status().is_terminal() {
        return Err(ApiError::Conflict(format!(
            "run {run_id} is {}; revert its patches once it has ended",
            run.status
        )));
    }
    if row.patch_status == "reverted" {
        return Err(ApiError::Conflict(format!(
            "patch {artifact_id} is already reverted"
        )));
    }
    let patch = patches::content(&state.content, &state.pool, &row.id).await?;
    let unavailable = |why: String| ApiError::Coded {
        status: StatusCode::CONFLICT,
        code: ErrorCode::WorkspaceUnavailable,
        message: format!(
            "run {run_id}'s workspace is not reachable from this API process ({why}); revert \
             where the worker's data directory is shared (keel serve, or one KEEL_DATA_DIR)"
        ),
    };
    let roots = &state.rules.workspace_roots;
    let data_dir = roots
        .data_dir()
        .ok_or_else(|| unavailable("no data directory is configured".into()))?;
    let dir = workspace_dir(roots, data_dir, &task, &run).map_err(unavailable)?;
    let dir = dir
        .canonicalize()
        .ok()
        .filter(|d| d.is_dir())
        .ok_or_else(|| unavailable(format!("{} does not exist here", dir.display())))?;
    // The file changes while the row is locked: a concurrent revert waits, then sees
    // `reverted`.
    let reverting = patch.clone();
    tokio::task::spawn_blocking(move || tools::revert(&dir, &reverting))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(|e| match e {
            RevertError::Drift(message) | RevertError::Refused(message) => {
                ApiError::Conflict(message)
            }
        })?;
    let subject = Subject::Run {
        task_id: &task_id,
        run_id: &run_id,
    };
    patches::mark_reverted(&mut tx, scope, subject, &row.id, &patch.path).await?;
    tx.commit().await?;
    row.patch_status = "reverted".into();
    Ok(Json(envelope("task_patch", detail(row, patch))))
}
