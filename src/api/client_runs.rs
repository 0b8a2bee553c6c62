//! Client-orchestrated runs over HTTP: a start that hands the caller the run's lease, and
//! the appends its client records its work with (`runs::client`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use keel_api_types::{ClientRun, ClientRunRequest, RunEventsAccepted, RunEventsRequest};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::ApiJson;
use crate::api::{ApiError, AppState, ObjectEnvelope, object};
use crate::domain::Caller;
use crate::runs::client;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(start_client_run))
        .routes(routes!(append_run_events))
}

/// Starts a run its caller carries out itself (an editor, an ACP host): running at once,
/// never queued for a worker and behind no approval gate, since Keel executes nothing of
/// it. The answer holds the lease token, shown this once: every append sends it, and each
/// renews the lease for `lease_ms`. A lease that lapses fails the run
/// (`client_lease_expired`). 409 when the task already has an active run.
#[utoipa::path(post, path = "/tasks/{task_id}/client-runs", tag = "runs",
    params(("task_id" = String, Path)), request_body = ClientRunRequest,
    responses((status = 201, description = "The running run and its lease", body = ObjectEnvelope<ClientRun>),
              (status = 409, description = "The task already has an active run")))]
async fn start_client_run(
    State(state): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
    ApiJson(request): ApiJson<ClientRunRequest>,
) -> Result<(StatusCode, Json<ObjectEnvelope<ClientRun>>), ApiError> {
    client::check_start(&request)?;
    let mut tx = state.pool.begin().await?;
    let (scope, actor) = (&caller.scope, &caller.actor());
    let started = client::start(&mut tx, scope, &task_id, &request, &state.rules, actor).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(object("client_run", started))))
}

/// Records what a client-orchestrated run's client did, in order: its steps (finished),
/// its text artifacts (complete, `kind` `file`, a name once per run), its events (`client.event`, with `data.kind` and `data.data`) and its end, with the
/// sequence and feed guarantees of every run event; an empty append renews the lease. 403
/// when the token does not hold the run; 409 when the run is a worker's, has ended, or its
/// lease lapsed.
#[utoipa::path(post, path = "/tasks/{task_id}/runs/{run_id}/events", tag = "runs",
    params(("task_id" = String, Path), ("run_id" = String, Path)), request_body = RunEventsRequest,
    responses((status = 200, description = "What was recorded, and the renewed lease", body = ObjectEnvelope<RunEventsAccepted>),
              (status = 409, description = "A worker's run, an ended run, or a lapsed lease")))]
async fn append_run_events(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
    ApiJson(request): ApiJson<RunEventsRequest>,
) -> Result<Json<ObjectEnvelope<RunEventsAccepted>>, ApiError> {
    client::check_append(&request)?;
    let mut tx = state.pool.begin().await?;
    let ids = (task_id.as_str(), run_id.as_str());
    let (scope, actor) = (&caller.scope, &caller.actor());
    let store = (scope, &state.content);
    let accepted = client::append(&mut tx, store, ids, &request, actor).await?;
    tx.commit().await?;
    Ok(Json(object("run_events_accepted", accepted)))
}
