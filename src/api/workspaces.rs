//! The caller's workspace, and what an operator sets per workspace (its limits and its
//! approval policy): the local operator on any workspace, a remote operator on its own
//! (its org is where it acts, as everywhere).

use axum::Json;
use axum::extract::{Path, State};
use keel_api_types::{ApprovalPolicyRecord, ApprovalPolicyRequest, LimitsRequest};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::ApiJson;
use crate::api::{ApiError, AppState, ObjectEnvelope, object};
use crate::approvals;
use crate::approvals::ApprovalPolicy;
use crate::domain::identity::checked_id;
use crate::domain::{Caller, Scope};
use crate::workspaces;
use crate::workspaces::WorkspaceLimits;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(own_limits))
        .routes(routes!(get_limits, put_limits))
        .routes(routes!(get_policy, put_policy, delete_policy))
}

/// The caller's own workspace and its limits.
#[utoipa::path(get, path = "/workspace", tag = "system",
    responses((status = 200, description = "The caller's workspace", body = ObjectEnvelope<WorkspaceLimits>)))]
async fn own_limits(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<ObjectEnvelope<WorkspaceLimits>>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let limits = workspaces::limits(&mut conn, &caller.scope).await?;
    Ok(Json(object("workspace_limits", limits)))
}

/// A workspace an operator names in the path.
fn operator_scope(caller: &Caller, workspace_id: String) -> Result<Scope, ApiError> {
    caller
        .require_operator("read or set a workspace's limits and approval policy")
        .map_err(ApiError::Forbidden)?;
    // The same rule as the org ids that name workspaces in remote mode.
    let scope = checked_id(&workspace_id).map(Scope::new).ok_or_else(|| {
        ApiError::invalid("workspace_id must be 1 to 128 printable ASCII characters, no spaces")
    })?;
    if !caller.is_local() && scope != caller.scope {
        return Err(ApiError::Forbidden(
            "a remote operator reads and sets its own workspace's settings only".into(),
        ));
    }
    Ok(scope)
}

/// A workspace's limits (operators only).
#[utoipa::path(get, path = "/workspaces/{workspace_id}/limits", tag = "system",
    params(("workspace_id" = String, Path, pattern = "^[!-~]{1,128}$")),
    responses((status = 200, description = "The workspace's limits", body = ObjectEnvelope<WorkspaceLimits>)))]
async fn get_limits(
    State(state): State<AppState>,
    caller: Caller,
    Path(workspace_id): Path<String>,
) -> Result<Json<ObjectEnvelope<WorkspaceLimits>>, ApiError> {
    let scope = operator_scope(&caller, workspace_id)?;
    let mut conn = state.pool.acquire().await?;
    let limits = workspaces::limits(&mut conn, &scope).await?;
    Ok(Json(object("workspace_limits", limits)))
}

/// Sets a workspace's limits (operators only). Workers apply them at their next claim
/// when they run with `KEEL_MAX_CONCURRENT_PER_WORKSPACE` set.
#[utoipa::path(put, path = "/workspaces/{workspace_id}/limits", tag = "system",
    params(("workspace_id" = String, Path, pattern = "^[!-~]{1,128}$")), request_body = LimitsRequest,
    responses((status = 200, description = "The workspace's limits", body = ObjectEnvelope<WorkspaceLimits>)))]
async fn put_limits(
    State(state): State<AppState>,
    caller: Caller,
    Path(workspace_id): Path<String>,
    ApiJson(request): ApiJson<LimitsRequest>,
) -> Result<Json<ObjectEnvelope<WorkspaceLimits>>, ApiError> {
    let scope = operator_scope(&caller, workspace_id)?;
    let max = match request.max_concurrent {
        None => None,
        Some(n) => Some(i32::try_from(n).map_err(|_| {
            ApiError::invalid("max_concurrent must be at most 2147483647".to_string())
        })?),
    };
    let mut conn = state.pool.acquire().await?;
    let limits = workspaces::set_limits(&mut conn, &scope, max, &caller.actor()).await?;
    Ok(Json(object("workspace_limits", limits)))
}

/// A workspace's approval policy (operators only): its own, or the process setting
/// (`source: default`) when it has none.
#[utoipa::path(get, path = "/workspaces/{workspace_id}/approval-policy", tag = "approvals",
    params(("workspace_id" = String, Path, pattern = "^[!-~]{1,128}$")),
    responses((status = 200, description = "The policy in force", body = ObjectEnvelope<ApprovalPolicyRecord>)))]
async fn get_policy(
    State(state): State<AppState>,
    caller: Caller,
    Path(workspace_id): Path<String>,
) -> Result<Json<ObjectEnvelope<ApprovalPolicyRecord>>, ApiError> {
    let scope = operator_scope(&caller, workspace_id)?;
    let mut conn = state.pool.acquire().await?;
    let policy = approvals::show_policy(&mut conn, &scope, &state.rules.approvals).await?;
    Ok(Json(object("approval_policy", policy)))
}

/// Sets a workspace's approval policy, whole (operators only). It applies to the next
/// admission and the next response's tool calls, without a restart; the change is in the
/// audit trail (`entity_type=approval_policy`).
#[utoipa::path(put, path = "/workspaces/{workspace_id}/approval-policy", tag = "approvals",
    params(("workspace_id" = String, Path, pattern = "^[!-~]{1,128}$")),
    request_body = ApprovalPolicyRequest,
    responses((status = 200, description = "The policy in force", body = ObjectEnvelope<ApprovalPolicyRecord>)))]
async fn put_policy(
    State(state): State<AppState>,
    caller: Caller,
    Path(workspace_id): Path<String>,
    ApiJson(request): ApiJson<ApprovalPolicyRequest>,
) -> Result<Json<ObjectEnvelope<ApprovalPolicyRecord>>, ApiError> {
    let scope = operator_scope(&caller, workspace_id)?;
    let policy = ApprovalPolicy::of_request(&request)?;
    set_policy(&state, &caller, &scope, Some(&policy)).await
}

/// Removes a workspace's own approval policy (operators only): the process setting
/// applies again.
#[utoipa::path(delete, path = "/workspaces/{workspace_id}/approval-policy", tag = "approvals",
    params(("workspace_id" = String, Path, pattern = "^[!-~]{1,128}$")),
    responses((status = 200, description = "The policy in force: the process setting", body = ObjectEnvelope<ApprovalPolicyRecord>)))]
async fn delete_policy(
    State(state): State<AppState>,
    caller: Caller,
    Path(workspace_id): Path<String>,
) -> Result<Json<ObjectEnvelope<ApprovalPolicyRecord>>, ApiError> {
    let scope = operator_scope(&caller, workspace_id)?;
    set_policy(&state, &caller, &scope, None).await
}

async fn set_policy(
    state: &AppState,
    caller: &Caller,
    scope: &Scope,
    policy: Option<&ApprovalPolicy>,
) -> Result<Json<ObjectEnvelope<ApprovalPolicyRecord>>, ApiError> {
    let mut tx = state.pool.begin().await?;
    let default = &state.rules.approvals;
    let record = approvals::set_policy(&mut tx, scope, policy, default, &caller.actor()).await?;
    tx.commit().await?;
    Ok(Json(object("approval_policy", record)))
}
