//! A run's patches: the file changes its agent tools made or proposed (patch artifacts),
//! and what an operator who did not request the run does with them: revert, apply a
//! proposal, discard one (as for an approval: a second person decides). Reverting
//! and applying write the run's workspace, so it works only where this API process
//! shares the worker's data directory (`keel serve`, or one `KEEL_DATA_DIR` on a shared
//! volume); elsewhere it answers 409 `workspace_unavailable`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use keel_api_types::ErrorCode;
use keel_api_types::{PatchDetail, PatchStatus, PatchSummary};
use keel_workers::agent::Patch;
use keel_workers::agent::tools::{self, RevertError};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::ApiQuery;
use crate::api::{
    ApiError, AppState, ListEnvelope, ObjectEnvelope, PageQuery, list, object as envelope,
    page_limit,
};
use crate::approvals;
use crate::domain::Caller;
use crate::events::Subject;
use crate::runs::job::workspace_dir;
use crate::runs::patches;
use crate::runs::patches::{PatchAction, PatchRow};
use crate::{runs, tasks};

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

/// Carries out `action` on a patch of an ended run, for an operator other than the run's
/// requester (403 otherwise): the file written (for a revert or an apply) while the
/// patch's row is locked, so a concurrent change waits and then sees the new status; the
/// status and its event committed after.
async fn change(
    state: &AppState,
    caller: &Caller,
    (task_id, run_id, artifact_id): (String, String, String),
    action: PatchAction,
) -> Result<Json<ObjectEnvelope<PatchDetail>>> {
    caller
        .require_operator("apply, revert or discard a run's patches")
        .map_err(ApiError::Forbidden)?;
    let scope = &caller.scope;
    let mut tx = state.pool.begin().await?;
    let run = runs::get(&mut tx, scope, &task_id, &run_id).await?;
    let approver = approvals::Approver {
        actor: caller.actor(),
        may_approve_own: state.auth.may_approve_own(caller),
    };
    let what = "apply, revert or discard its patches";
    approvals::check_approver(run.requested_by.as_deref(), &approver, what)?;
    let task = tasks::get(&mut tx, scope, &task_id).await?;
    let mut row = patches::get(&mut tx, scope, &run_id, &artifact_id, true).await?;
    if !run.status().is_terminal() {
        return Err(ApiError::Conflict(format!(
            "run {run_id} is {}; change its patches once it has ended",
            run.status
        )));
    }
    let from = PatchStatus::parse(&row.patch_status)
        .ok_or_else(|| ApiError::Internal(format!("patch status {}", row.patch_status)))?;
    let to = action
        .next(from)
        .map_err(|why| ApiError::Conflict(format!("patch {artifact_id}: {why}")))?;
    let patch = patches::content(&state.content, &state.pool, &row.id).await?;
    if action.writes() {
        let dir = run_workspace(state, &task, &run)?;
        let changing = patch.clone();
        let write = move || match action {
            PatchAction::Apply => tools::apply(&dir, &changing),
            _ => tools::revert(&dir, &changing),
        };
        tokio::task::spawn_blocking(write)
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| match e {
                RevertError::Drift(message) | RevertError::Refused(message) => {
                    ApiError::Conflict(message)
                }
            })?;
    }
    let subject = Subject::Run {
        task_id: &task_id,
        run_id: &run_id,
    };
    let changed = (row.id.as_str(), patch.path.as_str());
    patches::mark(&mut tx, scope, subject, changed, action, to).await?;
    tx.commit().await?;
    row.patch_status = to.to_string();
    Ok(Json(envelope("task_patch", detail(row, patch))))
}

/// The run's workspace directory, when this process reaches it.
fn run_workspace(
    state: &AppState,
    task: &tasks::TaskRecord,
    run: &runs::RunRecord,
) -> Result<std::path::PathBuf> {
    let unavailable = |why: String| ApiError::Coded {
        status: StatusCode::CONFLICT,
        code: ErrorCode::WorkspaceUnavailable,
        message: format!(
            "run {}'s workspace is not reachable from this API process ({why}); change its \
             files where the worker's data directory is shared (keel serve, or one \
             KEEL_DATA_DIR)",
            run.id
        ),
    };
    let roots = &state.rules.workspace_roots;
    let data_dir = roots
        .data_dir()
        .ok_or_else(|| unavailable("no data directory is configured".into()))?;
    let dir = workspace_dir(roots, data_dir, task, run).map_err(unavailable)?;
    dir.canonicalize()
        .ok()
        .filter(|d| d.is_dir())
        .ok_or_else(|| unavailable(format!("{} does not exist here", dir.display())))
}
