//! Approvals: per task, the cross-task list_approvals, and resolution.

use axum::Json;
use axum::extract::{Path, State};
use keel_api_types::{ApprovalStatus, ListOrder, Resolution, ResolveRequest};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{ApiJson, ApiQuery};
use crate::api::{
    ApiError, AppState, ListEnvelope, ObjectEnvelope, list, list_order, object, page_limit,
};
use crate::approvals::{ApprovalFilter, ApprovalRecord};
use crate::approvals::{ApprovalKind, Decision};
use crate::domain::Caller;
use crate::{approvals, external, runs, tasks};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_approvals))
        .routes(routes!(list_task_approvals))
        .routes(routes!(get_approval))
        .routes(routes!(resolve_approval))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ApprovalQuery {
    #[param(value_type = Option<ApprovalStatus>, inline)]
    status: Option<String>,
    /// Only this run's approvals.
    run_id: Option<String>,
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
    /// `asc`, oldest first (the default), or `desc`, newest first; the cursor pages on in
    /// the same order.
    #[param(value_type = Option<ListOrder>, inline)]
    order: Option<String>,
}

impl ApprovalQuery {
    /// The page to read: the order, and the last approval of the previous page.
    fn page(&self) -> Result<(ListOrder, Option<&str>), ApiError> {
        Ok((list_order(self.order.as_deref())?, self.cursor.as_deref()))
    }

    /// The query's filters, under `task_id` when the path names a task.
    fn filter<'a>(&'a self, task_id: Option<&'a str>) -> Result<ApprovalFilter<'a>, ApiError> {
        let status = match self.status.as_deref() {
            Some(status) if ApprovalStatus::parse(status).is_none() => {
                return Err(ApiError::invalid(format!(
                    "unknown approval status '{status}' (expected {})",
                    ApprovalStatus::names()
                )));
            }
            other => other,
        };
        let run_id = self.run_id.as_deref();
        Ok(ApprovalFilter {
            task_id,
            run_id,
            status,
        })
    }
}

/// The approval inbox across tasks, oldest first (newest first with `order=desc`);
/// `run_id` narrows it to one run's.
#[utoipa::path(get, path = "/approvals", tag = "approvals", params(ApprovalQuery),
    responses((status = 200, description = "A page of approvals", body = ListEnvelope<ApprovalRecord>)))]
async fn list_approvals(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ApprovalQuery>,
) -> Result<Json<ListEnvelope<ApprovalRecord>>, ApiError> {
    let limit = page_limit(query.limit)?;
    let (filter, page) = (query.filter(None)?, query.page()?);
    let mut conn = state.pool.acquire().await?;
    let rows = approvals::list(&mut conn, &caller.scope, filter, page, limit + 1).await?;
    Ok(Json(list(rows, limit, |a| a.id.clone())))
}

/// A task's approvals, oldest first (newest first with `order=desc`).
#[utoipa::path(get, path = "/tasks/{task_id}/approvals", tag = "approvals",
    params(("task_id" = String, Path), ApprovalQuery),
    responses((status = 200, description = "A page of approvals", body = ListEnvelope<ApprovalRecord>)))]
async fn list_task_approvals(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
    ApiQuery(query): ApiQuery<ApprovalQuery>,
) -> Result<Json<ListEnvelope<ApprovalRecord>>, ApiError> {
    let limit = page_limit(query.limit)?;
    let (filter, page) = (query.filter(Some(&task_id))?, query.page()?);
    let mut conn = state.pool.acquire().await?;
    tasks::get(&mut conn, &caller.scope, &task_id).await?;
    let rows = approvals::list(&mut conn, &caller.scope, filter, page, limit + 1).await?;
    Ok(Json(list(rows, limit, |a| a.id.clone())))
}

/// Reads an approval.
#[utoipa::path(get, path = "/tasks/{task_id}/approvals/{approval_id}", tag = "approvals",
    params(("task_id" = String, Path), ("approval_id" = String, Path)),
    responses((status = 200, description = "The approval", body = ObjectEnvelope<ApprovalRecord>)))]
async fn get_approval(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, approval_id)): Path<(String, String)>,
) -> Result<Json<ObjectEnvelope<ApprovalRecord>>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let approval = approvals::get(&mut conn, &caller.scope, &task_id, &approval_id).await?;
    Ok(Json(object("task_approval", approval)))
}

/// Approves or rejects a pending approval; approving the last gate queues the run,
/// rejecting cancels it (a tool-call approval rejected with `continue` queues it, the
/// model reading a refusal). 409 when the approval is not pending; 400 for `continue`
/// on another kind.
#[utoipa::path(post, path = "/tasks/{task_id}/approvals/{approval_id}/resolve", tag = "approvals",
    params(("task_id" = String, Path), ("approval_id" = String, Path)), request_body = ResolveRequest,
    responses((status = 200, description = "The resolved approval and its run", body = ObjectEnvelope<Resolution>)))]
async fn resolve_approval(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, approval_id)): Path<(String, String)>,
    ApiJson(request): ApiJson<ResolveRequest>,
) -> Result<Json<ObjectEnvelope<Resolution>>, ApiError> {
    let (decision, note) = Decision::of_resolve(&request)?;
    let continues = decision == Decision::RejectAndContinue;
    caller
        .require_operator("resolve an approval")
        .map_err(ApiError::Forbidden)?;
    let approver = approvals::Approver {
        actor: caller.actor(),
        may_approve_own: state.auth.may_approve_own(&caller),
    };
    let mut tx = state.pool.begin().await?;
    if continues {
        // The kind never changes: read before the locks resolve takes.
        let approval = approvals::get(&mut tx, &caller.scope, &task_id, &approval_id).await?;
        if approval.kind != ApprovalKind::AgentLoopToolCall.as_str() {
            return Err(ApiError::invalid(format!(
                "continue is only for agent_loop_tool_call approvals; {approval_id} is {}",
                approval.kind
            )));
        }
    }
    let (scope, actor) = (&caller.scope, &approver.actor);
    let found = approvals::decidable(&mut tx, scope, &task_id, &approval_id, &approver).await?;
    // An external action's approval decides its action; any other is a gate of its run.
    let (approval, run) = match &found.external_action_id {
        Some(action_id) => {
            external::actions::resolve_approval(
                &mut tx, scope, &found, action_id, decision, note, actor,
            )
            .await?
        }
        None => runs::resolve_gate(&mut tx, scope, &found, decision, note, actor).await?,
    };
    tx.commit().await?;
    Ok(Json(object("task_approval", Resolution { approval, run })))
}
