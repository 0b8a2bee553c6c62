//! A run's patches: the file changes its agent tools made or proposed (patch artifacts),
//! and what an operator who did not request the run does with them: revert, apply a
//! proposal, discard one (as for an approval: a second person decides). Reverting
//! and applying write the run's workspace, so it works only where this API process
//! shares the worker's data directory (`keel serve`, or one `KEEL_DATA_DIR` on a shared
//! volume); elsewhere it answers 409 `workspace_unavailable`.

use axum::Json;
use axum::extract::{Path, State};
use keel_api_types::{PatchDetail, PatchSummary};
use keel_workers::agent::Patch;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::ApiQuery;
use crate::api::{
    ApiError, AppState, ListEnvelope, ObjectEnvelope, PageQuery, list, object as envelope,
    page_limit,
};
use crate::approvals;
use crate::domain::Caller;
use crate::runs;
use crate::runs::patches;
use crate::runs::patches::{PatchAction, PatchRow};

type Result<T, E = ApiError> = std::result::Result<T, E>;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_patches))
        .routes(routes!(get_patch))
        .routes(routes!(revert_patch))
        .routes(routes!(apply_patch))
        .routes(routes!(discard_patch))
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
/// since (the workspace is left untouched), when the patch is not applied, or while the
/// run is active; 409 `workspace_unavailable` when this process cannot reach the run's
/// workspace (it does not share the worker's data directory); 403 `forbidden` for a member,
/// and for the run's requester unless they may approve their own (local mode,
/// `KEEL_ALLOW_SELF_APPROVAL`).
#[utoipa::path(post, path = "/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}/revert", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path), ("artifact_id" = String, Path)),
    responses((status = 200, description = "The reverted patch", body = ObjectEnvelope<PatchDetail>),
              (status = 403, description = "A member, or the run's requester"),
              (status = 409, description = "Drift, not applied, an active run, or no workspace here")))]
async fn revert_patch(
    State(state): State<AppState>,
    caller: Caller,
    Path(ids): Path<(String, String, String)>,
) -> Result<Json<ObjectEnvelope<PatchDetail>>> {
    change(&state, &caller, ids, PatchAction::Revert).await
}

/// Writes a proposed patch's content (removes the file when the proposal deletes it), only
/// if the file is still exactly what it was when the patch was proposed; 409 `conflict`
/// when it changed since (the workspace is left untouched), when the patch is not
/// proposed, or while the run is active; 409 `workspace_unavailable` as for a revert; 403
/// for a member or the run's requester, as for a revert.
#[utoipa::path(post, path = "/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}/apply", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path), ("artifact_id" = String, Path)),
    responses((status = 200, description = "The applied patch", body = ObjectEnvelope<PatchDetail>),
              (status = 403, description = "A member, or the run's requester"),
              (status = 409, description = "Drift, not proposed, an active run, or no workspace here")))]
async fn apply_patch(
    State(state): State<AppState>,
    caller: Caller,
    Path(ids): Path<(String, String, String)>,
) -> Result<Json<ObjectEnvelope<PatchDetail>>> {
    change(&state, &caller, ids, PatchAction::Apply).await
}

/// Drops a proposed patch; its file is never touched. 409 `conflict` when the patch is not
/// proposed or while the run is active; 403 for a member or the run's requester.
#[utoipa::path(post, path = "/tasks/{task_id}/runs/{run_id}/patches/{artifact_id}/discard", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path), ("artifact_id" = String, Path)),
    responses((status = 200, description = "The discarded patch", body = ObjectEnvelope<PatchDetail>),
              (status = 403, description = "A member, or the run's requester"),
              (status = 409, description = "Not proposed, or an active run")))]
async fn discard_patch(
    State(state): State<AppState>,
    caller: Caller,
    Path(ids): Path<(String, String, String)>,
) -> Result<Json<ObjectEnvelope<PatchDetail>>> {
    change(&state, &caller, ids, PatchAction::Discard).await
}

/// Carries out `action` for an operator (403 for a member; see [`patches::change`]).
async fn change(
    state: &AppState,
    caller: &Caller,
    (task_id, run_id, artifact_id): (String, String, String),
    action: PatchAction,
) -> Result<Json<ObjectEnvelope<PatchDetail>>> {
    caller
        .require_operator("apply, revert or discard a run's patches")
        .map_err(ApiError::Forbidden)?;
    let desk = patches::PatchDesk {
        pool: &state.pool,
        content: &state.content,
        roots: &state.rules.workspace_roots,
        approver: approvals::Approver {
            actor: caller.actor(),
            may_approve_own: state.auth.may_approve_own(caller),
        },
    };
    let ids = (task_id.as_str(), run_id.as_str(), artifact_id.as_str());
    let (row, patch) = patches::change(&desk, &caller.scope, ids, action).await?;
    Ok(Json(envelope("task_patch", detail(row, patch))))
}
