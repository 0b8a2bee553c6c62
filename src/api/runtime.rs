//! The runtime itself: who this runtime and its caller are (`GET /v1/whoami`), and the
//! local-only actions on its process (`POST /v1/system/shutdown`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use keel_api_types::{RuntimeHost, Session, ShutdownAccepted};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::auth::{LocalAccess, RuntimeMode, local_only_actions};
use crate::api::{AppState, ObjectEnvelope, object};
use crate::domain::Caller;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(whoami))
        .routes(routes!(shutdown))
}

/// This runtime host and the caller of this request. Neither field grants access.
#[utoipa::path(get, path = "/whoami", tag = "system",
    responses((status = 200, description = "The session", body = ObjectEnvelope<Session>)))]
async fn whoami(
    State(state): State<AppState>,
    caller: Caller,
    LocalAccess(local): LocalAccess,
) -> Json<ObjectEnvelope<Session>> {
    let mode = state.auth.mode();
    let operator_access = match mode {
        RuntimeMode::Local => "local_operator",
        RuntimeMode::Remote => "remote_supervision",
    };
    let session = Session {
        may_approve_own: state.auth.may_approve_own(&caller),
        role: caller.role.as_str().into(),
        workspace: caller.scope.workspace().to_string(),
        actor_id: caller.actor_id,
        runtime_host: RuntimeHost {
            id: state.runtime_host_id.to_string(),
            label: state.auth.label().to_string(),
            runtime_mode: mode,
            operator_access: operator_access.into(),
            local_only_actions_available: local,
            local_only_actions: if local {
                local_only_actions()
            } else {
                Vec::new()
            },
        },
        remote_identity: caller.remote,
    };
    Json(object("session", session))
}

/// Stops this process cleanly (local-only): the API drains its requests and, under
/// `keel serve`, the worker hands back its jobs.
#[utoipa::path(post, path = "/system/shutdown", tag = "system",
    responses((status = 202, description = "Shutting down", body = ObjectEnvelope<ShutdownAccepted>)))]
async fn shutdown(
    State(state): State<AppState>,
    caller: Caller,
) -> (StatusCode, Json<ObjectEnvelope<ShutdownAccepted>>) {
    tracing::info!(actor = %caller.actor_id, "shutdown requested through the API");
    state.shutdown.cancel();
    let accepted = ShutdownAccepted {
        status: "shutting_down".into(),
    };
    (StatusCode::ACCEPTED, Json(object("shutdown", accepted)))
}
