//! How a request becomes a run: start, retry, resume, continue and retry-from-model-call
//! all admit through here, with the request's `Idempotency-Key`.

use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use keel_api_types::StartRequest;

use crate::api::{ApiError, AppState, ObjectEnvelope, object};
use crate::domain::Caller;
use crate::runs::{self, Admission, Admitted, Orchestrator, Origin, RunRecord};
use crate::tasks::parse_budget;

const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A run: 201 when created, 200 when an `Idempotency-Key` replays an earlier request.
pub(super) type Admitted201 = (StatusCode, Json<ObjectEnvelope<RunRecord>>);

/// Start, retry, resume, continue and retry-from-model-call: one transaction that creates
/// the run (starting from `conversation_base`, for agent loops), gates or enqueues it and
/// records its events. A replayed `Idempotency-Key` returns the original run with 200.
pub(super) async fn admit(
    state: &AppState,
    caller: &Caller,
    task_id: &str,
    origin: Origin,
    headers: &HeaderMap,
    request: StartRequest,
    conversation_base: Option<serde_json::Value>,
) -> Result<Admitted201, ApiError> {
    let budget_micros_usd = request
        .budget_micros_usd
        .map(|b| parse_budget(Some(b)))
        .transpose()?;
    let idempotency = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(value) => {
            let key = value
                .to_str()
                .ok()
                .filter(|k| {
                    let visible = k.bytes().all(|b| b.is_ascii_graphic());
                    visible && !k.is_empty() && k.len() <= 255
                })
                .ok_or_else(|| {
                    ApiError::invalid("Idempotency-Key must be 1 to 255 visible ASCII characters")
                })?;
            let fingerprint =
                serde_json::json!({ "origin": origin.fingerprint(), "body": request });
            Some((key.to_string(), fingerprint))
        }
    };
    let admission = Admission {
        origin,
        idempotency,
        reason: request.reason,
        budget_micros_usd,
        schedule: None,
        conversation_base,
        orchestrator: Orchestrator::Worker,
        requester: None,
    };
    let mut tx = state.pool.begin().await?;
    let (scope, actor) = (&caller.scope, &caller.actor());
    let admitted = runs::admit(&mut tx, scope, task_id, admission, &state.rules, actor).await?;
    tx.commit().await?;
    Ok(match admitted {
        Admitted::New(run) => (StatusCode::CREATED, Json(object("task_run", run))),
        Admitted::Replayed(run) => (StatusCode::OK, Json(object("task_run", run))),
    })
}
