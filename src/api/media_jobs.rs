//! Media jobs (seed 000, "Media Jobs"): created as `queued` metadata, enqueued by `run`,
//! executed by a worker. Their events are in the public feed (`GET /v1/events`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use keel_api_types::ErrorCode;
use keel_api_types::MediaJobDraft;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{ApiJson, ApiQuery};
use crate::api::{
    ApiError, AppState, ContentQuery, ListEnvelope, ObjectEnvelope, PageQuery, list, object,
    page_limit,
};
use crate::artifacts;
use crate::artifacts::ArtifactRecord;
use crate::domain::Caller;
use crate::events::Subject;
use crate::media::{ListFilter, MediaJobRecord, NewMediaJob, Refused};
use crate::media::{MediaJobStatus, Unrunnable, parse_operation};

type Result<T> = std::result::Result<T, ApiError>;

/// Longest accepted prompt, in bytes.
const MAX_PROMPT_BYTES: usize = 32 * 1024;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_media_jobs, create_media_job))
        .routes(routes!(get_media_job))
        .routes(routes!(run_media_job))
        .routes(routes!(cancel_media_job))
        .routes(routes!(list_media_artifacts))
        .routes(routes!(media_artifact_content))
}

impl From<Refused> for ApiError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::Store(error) => error.into(),
            Refused::Unrunnable(reason) => ApiError::Coded {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                code: match reason {
                    Unrunnable::Disabled(_) => ErrorCode::ProviderDisabled,
                    _ => ErrorCode::UnsupportedCapability,
                },
                message: reason.to_string(),
            },
        }
    }
}

/// Creates a media job, `queued`.
#[utoipa::path(post, path = "/media-jobs", tag = "media", request_body = MediaJobDraft,
    responses((status = 201, description = "The new job", body = ObjectEnvelope<MediaJobRecord>)))]
async fn create_media_job(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(draft): ApiJson<MediaJobDraft>,
) -> Result<(StatusCode, Json<ObjectEnvelope<MediaJobRecord>>)> {
    let operation = parse_operation(&draft.operation)?;
    if draft.prompt.trim().is_empty() || draft.prompt.len() > MAX_PROMPT_BYTES {
        return Err(invalid("prompt", "must be 1 byte to 32 KiB, not blank"));
    }
    if !draft.input.is_object() {
        return Err(invalid("input", "must be an object"));
    }
    crate::domain::check_free_json("input", &draft.input)?;
    let job = NewMediaJob {
        provider_id: &draft.provider_id,
        operation,
        prompt: &draft.prompt,
        input: &draft.input,
    };
    let mut tx = state.pool.begin().await?;
    let job = crate::media::create(&mut tx, &caller.scope, job, &caller.actor()).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(object("media_job", job))))
}

fn invalid(field: &'static str, message: &str) -> ApiError {
    crate::domain::Invalid::new(field, message).into()
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct MediaJobListQuery {
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
    #[param(value_type = Option<MediaJobStatus>, inline)]
    status: Option<String>,
    /// Only jobs of this provider preset.
    provider_id: Option<String>,
}

/// Lists media jobs, oldest first.
#[utoipa::path(get, path = "/media-jobs", tag = "media", params(MediaJobListQuery),
    responses((status = 200, description = "A page of media jobs", body = ListEnvelope<MediaJobRecord>)))]
async fn list_media_jobs(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<MediaJobListQuery>,
) -> Result<Json<ListEnvelope<MediaJobRecord>>> {
    let limit = page_limit(query.limit)?;
    let status = match query.status.as_deref() {
        None => None,
        Some(s) => Some(MediaJobStatus::parse(s).ok_or_else(|| {
            ApiError::invalid(format!(
                "status must be queued, running, succeeded, failed or cancelled, not {s:?}"
            ))
        })?),
    };
    let filter = ListFilter {
        status,
        provider_id: query.provider_id,
    };
    let mut conn = state.pool.acquire().await?;
    let (scope, cursor) = (&caller.scope, query.cursor.as_deref());
    let rows = crate::media::list(&mut conn, scope, &filter, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |j| j.id.clone())))
}

/// Reads a media job.
#[utoipa::path(get, path = "/media-jobs/{media_job_id}", tag = "media",
    params(("media_job_id" = String, Path)),
    responses((status = 200, description = "The job", body = ObjectEnvelope<MediaJobRecord>)))]
async fn get_media_job(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ObjectEnvelope<MediaJobRecord>>> {
    let mut conn = state.pool.acquire().await?;
    let job = crate::media::get(&mut conn, &caller.scope, &id).await?;
    Ok(Json(object("media_job", job)))
}

/// Enqueues a `queued`, `failed` or `cancelled` job for a worker; `running` and
/// `succeeded` jobs answer 409 `media_job_not_runnable`.
#[utoipa::path(post, path = "/media-jobs/{media_job_id}/run", tag = "media",
    params(("media_job_id" = String, Path)),
    responses((status = 202, description = "The job, queued", body = ObjectEnvelope<MediaJobRecord>)))]
async fn run_media_job(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<ObjectEnvelope<MediaJobRecord>>)> {
    let mut tx = state.pool.begin().await?;
    let job = crate::media::run(&mut tx, &caller.scope, &id, &caller.actor()).await?;
    tx.commit().await?;
    Ok((StatusCode::ACCEPTED, Json(object("media_job", job))))
}

/// Cancels a queued or running job (a running attempt is interrupted at once); an ended
/// job is returned unchanged.
#[utoipa::path(post, path = "/media-jobs/{media_job_id}/cancel", tag = "media",
    params(("media_job_id" = String, Path)),
    responses((status = 200, description = "The job", body = ObjectEnvelope<MediaJobRecord>)))]
async fn cancel_media_job(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ObjectEnvelope<MediaJobRecord>>> {
    let mut tx = state.pool.begin().await?;
    let job = crate::media::cancel(&mut tx, &caller.scope, &id, &caller.actor()).await?;
    tx.commit().await?;
    Ok(Json(object("media_job", job)))
}

/// The job's artifacts: each image or video, and `metadata.json`.
#[utoipa::path(get, path = "/media-jobs/{media_job_id}/artifacts", tag = "media",
    params(("media_job_id" = String, Path), PageQuery),
    responses((status = 200, description = "A page of artifacts", body = ListEnvelope<ArtifactRecord>)))]
async fn list_media_artifacts(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<ListEnvelope<ArtifactRecord>>> {
    let limit = page_limit(page.limit)?;
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    crate::media::get(&mut conn, scope, &id).await?;
    let (owner, cursor) = (Subject::MediaJob(&id), page.cursor.as_deref());
    let rows = artifacts::list(&mut conn, scope, owner, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |a| a.id.clone())))
}

/// An artifact's bytes (after `offset`), with its content type.
#[utoipa::path(get, path = "/media-jobs/{media_job_id}/artifacts/{artifact_id}/content", tag = "media",
    params(("media_job_id" = String, Path), ("artifact_id" = String, Path), ContentQuery),
    responses((status = 200, description = "The bytes", content_type = "application/octet-stream", body = String)))]
async fn media_artifact_content(
    State(state): State<AppState>,
    caller: Caller,
    Path((id, artifact_id)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<ContentQuery>,
) -> Result<Response> {
    let mut conn = state.pool.acquire().await?;
    let owner = Subject::MediaJob(&id);
    let artifact = artifacts::get(&mut conn, &caller.scope, owner, &artifact_id).await?;
    drop(conn);
    crate::api::artifact_body(&state, artifact, query).await
}
