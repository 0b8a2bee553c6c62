//! External work: WORKFLOW.md rendering, sources (a tracker and its workflow), polls and
//! imports of tracker items into tasks.

use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::ApiJson;
use super::{ApiError, AppState, ObjectEnvelope, object};
use crate::domain::Caller;
use crate::domain::workflow::{Issue, Workflow};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(render))
}

type Result<T> = std::result::Result<T, ApiError>;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RenderRequest {
    /// The whole WORKFLOW.md: front matter and prompt template.
    workflow_markdown: String,
    /// The normalized item the template sees as `issue`.
    issue: Issue,
    /// Null on a first run, the retry number after.
    #[serde(default)]
    attempt: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
struct Rendered {
    prompt: String,
}

/// Renders a workflow's prompt for an item, as a poll would; every workflow error class
/// answers 422 with its own type.
#[utoipa::path(post, path = "/external-work/render", tag = "external-work", request_body = RenderRequest,
    responses((status = 200, description = "The rendered prompt", body = ObjectEnvelope<Rendered>)))]
async fn render(
    _caller: Caller,
    ApiJson(request): ApiJson<RenderRequest>,
) -> Result<Json<ObjectEnvelope<Rendered>>> {
    let workflow = Workflow::parse(&request.workflow_markdown)?;
    let prompt = workflow.render(&request.issue, request.attempt)?;
    Ok(Json(object("workflow_render", Rendered { prompt })))
}
