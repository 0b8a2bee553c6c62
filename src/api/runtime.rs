//! The runtime itself: who this runtime and its caller are (`GET /v1/whoami`), and the
//! local-only actions on its process (`POST /v1/system/shutdown`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::{LocalAccess, RuntimeMode, local_only_actions};
use super::{AppState, ObjectEnvelope, object};
use crate::domain::Caller;
use crate::domain::identity::RemoteIdentity;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(whoami))
        .routes(routes!(shutdown))
}

#[derive(Debug, Serialize, ToSchema)]
struct Session {
    /// Always `operator`.
    #[schema(example = "operator")]
    role: &'static str,
    /// The actor this request acts as (`local` in local mode).
    actor_id: String,
    /// The workspace this request sees and changes.
    workspace: String,
    runtime_host: RuntimeHost,
    /// The identity the trusted proxy vouched for; absent in local mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    remote_identity: Option<RemoteIdentity>,
}

#[derive(Debug, Serialize, ToSchema)]
struct RuntimeHost {
    /// Generated once per database, stable across restarts and replicas.
    #[schema(example = "runtime_0190f7c1d2e37b4c8a5d6e7f80912a3b")]
    id: String,
    /// `KEEL_RUNTIME_LABEL`, else the host name.
    label: String,
    runtime_mode: RuntimeMode,
    /// `local_operator` or `remote_supervision`.
    #[schema(example = "local_operator")]
    operator_access: &'static str,
    /// Whether this request could use the local-only actions.
    local_only_actions_available: bool,
    /// The local-only actions this request may use (`METHOD /path`).
    local_only_actions: Vec<String>,
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
        role: "operator",
        workspace: caller.scope.workspace().to_string(),
        actor_id: caller.actor_id,
        runtime_host: RuntimeHost {
            id: state.runtime_host_id.to_string(),
            label: state.auth.label().to_string(),
            runtime_mode: mode,
            operator_access,
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

#[derive(Debug, Serialize, ToSchema)]
struct ShutdownAccepted {
    #[schema(example = "shutting_down")]
    status: &'static str,
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
        status: "shutting_down",
    };
    (StatusCode::ACCEPTED, Json(object("shutdown", accepted)))
}
