//! The HTTP API: `/healthz`, `/readyz` and the native API under `/v1`, with one error
//! envelope, a request id on every response, and cursor pagination on every list.

mod admission;
mod approvals;
mod auth;
mod body;
mod client_runs;
mod console;
mod error;
mod events;
mod external_work;
mod extract;
mod lineage;
mod listen;
mod media_jobs;
mod middleware;
mod openapi;
mod patches;
mod providers;
mod runtime;
mod schedules;
mod streams;
mod system;
mod tasks;
mod usage;
mod workspaces;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use keel_api_types::ListOrder;
use keel_workers::agent::provider::ChatLimits;
use serde::Deserialize;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;

use crate::artifacts::content::ContentStore;
use crate::providers::ProviderHosts;
use crate::providers::secrets::SecretPolicy;
use crate::runs::AdmissionRules;

pub use auth::{Auth, PAGE_ROUTES, ROUTE_POLICY, RouteClass, SettingsError};
pub use error::ApiError;
pub(crate) use keel_api_types::{ListEnvelope, ObjectEnvelope};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;
const DEFAULT_PAGE: i64 = 50;
const MAX_PAGE: i64 = 200;
// A page and the row that says there is another fit the task list's written bound.
const _: () = assert!(MAX_PAGE < crate::tasks::LIST_MAX_ROWS);

#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) pool: PgPool,
    /// The newest event id this process was notified of; SSE streams wait on it.
    pub(crate) events: watch::Receiver<i64>,
    /// How often a stream re-reads the database when no notification arrives.
    pub(crate) stream_poll: Duration,
    /// Live model text for run streams.
    pub(crate) deltas: Arc<events::ModelDeltas>,
    /// Fires at shutdown; open streams end so the server can drain.
    pub(crate) shutdown: CancellationToken,
    pub(crate) rules: AdmissionRules,
    /// Where artifact bytes are read from.
    pub(crate) content: ContentStore,
    /// Who may call, and how they prove it.
    pub(crate) auth: Arc<Auth>,
    /// This runtime host's id, kept in the database.
    pub(crate) runtime_host_id: Arc<str>,
    /// Which secret references presets may name.
    pub(crate) secrets: Arc<SecretPolicy>,
    /// Which hosts media presets may aim at.
    pub(crate) provider_hosts: Arc<ProviderHosts>,
    /// How live checks call chat providers.
    pub(crate) chat: ChatLimits,
    /// The event streams each identity holds open.
    pub(crate) streams: Arc<streams::StreamSlots>,
}

/// What an API process is configured with, beside its pool, listener and authentication.
pub(crate) struct ApiSettings {
    pub(crate) rules: AdmissionRules,
    pub(crate) content: ContentStore,
    /// How often a stream re-reads the database when no notification arrives.
    pub(crate) stream_poll: Duration,
    pub(crate) secrets: SecretPolicy,
    pub(crate) provider_hosts: ProviderHosts,
    pub(crate) chat: ChatLimits,
    /// How long a client may take to send a request's line and headers.
    pub(crate) header_read_timeout: Duration,
    /// How many event streams one identity may hold open on this process.
    pub(crate) max_streams_per_identity: usize,
    /// How long a request's body may take to arrive whole.
    pub(crate) body_read_timeout: Duration,
}

/// The header read timeout when the configuration says nothing.
pub(crate) const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves the API on `listener` until `shutdown` fires, in local mode without a runtime
/// token (the listener must be on a loopback address) and the default secret policy.
pub async fn serve(
    pool: PgPool,
    listener: tokio::net::TcpListener,
    rules: AdmissionRules,
    content: ContentStore,
    stream_poll: Duration,
    shutdown: CancellationToken,
) -> Result<(), std::io::Error> {
    let auth = Auth::local(listener.local_addr()?).map_err(std::io::Error::other)?;
    let settings = ApiSettings {
        rules,
        content,
        stream_poll,
        secrets: SecretPolicy::default(),
        provider_hosts: ProviderHosts::default(),
        chat: ChatLimits::default(),
        header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        max_streams_per_identity: crate::config::DEFAULT_MAX_STREAMS_PER_IDENTITY,
        body_read_timeout: Duration::from_secs(crate::config::DEFAULT_BODY_READ_TIMEOUT_SECS),
    };
    serve_with_auth(pool, listener, settings, auth, shutdown).await
}

/// Serves the API on `listener` until `shutdown` fires (also fired by
/// `POST /v1/system/shutdown`), with the given authentication.
pub(crate) async fn serve_with_auth(
    pool: PgPool,
    listener: tokio::net::TcpListener,
    settings: ApiSettings,
    auth: Auth,
    shutdown: CancellationToken,
) -> Result<(), std::io::Error> {
    let runtime_host_id = {
        let mut conn = pool.acquire().await.map_err(std::io::Error::other)?;
        crate::system::runtime::host_id(&mut conn)
            .await
            .map_err(std::io::Error::other)?
    };
    let events = events::follow_commits(pool.clone(), shutdown.clone());
    let deltas = events::ModelDeltas::new(pool.clone(), shutdown.clone());
    tracing::info!(
        address = %listener.local_addr()?,
        mode = ?auth.mode(),
        runtime_host_id,
        "API listening"
    );
    let state = AppState {
        pool,
        events,
        stream_poll: settings.stream_poll,
        deltas,
        shutdown: shutdown.clone(),
        rules: settings.rules,
        content: settings.content,
        auth: Arc::new(auth),
        runtime_host_id: runtime_host_id.into(),
        secrets: Arc::new(settings.secrets),
        provider_hosts: Arc::new(settings.provider_hosts),
        chat: settings.chat,
        streams: streams::StreamSlots::new(settings.max_streams_per_identity),
    };
    let app = app(state, settings.body_read_timeout);
    listen::serve(listener, app, settings.header_read_timeout, shutdown).await
}

/// Every documented route: the router and the OpenAPI document come from the same
/// `#[utoipa::path]` annotations, so they cannot drift apart.
fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::base())
        .merge(system::router())
        .nest(
            "/v1",
            tasks::router()
                .merge(approvals::router())
                .merge(patches::router())
                .merge(client_runs::router())
                .merge(schedules::router())
                .merge(events::router())
                .merge(external_work::router())
                .merge(providers::router())
                .merge(media_jobs::router())
                .merge(system::v1_router())
                .merge(workspaces::router())
                .merge(runtime::router())
                .merge(usage::router())
                .merge(openapi::router()),
        )
}

/// The OpenAPI document of this build (`keel openapi`, `GET /v1/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, doc) = routes().split_for_parts();
    openapi::finish(doc)
}

/// Every route the router serves, as method and path template: each operation of the
/// OpenAPI document, and the pages outside it ([`PAGE_ROUTES`]).
pub fn documented_routes() -> Vec<(String, String)> {
    let doc = openapi();
    let pages = PAGE_ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()));
    let operations = openapi::operations(&doc).map(|(m, path, _)| (m.to_string(), path.clone()));
    pages.chain(operations).collect()
}

pub(crate) fn app(state: AppState, body_read_timeout: Duration) -> Router {
    let (router, document) = routes().split_for_parts();
    let bodies = Arc::new(body::BodyRules::new(body_read_timeout, &document));
    let (auth, pool) = (state.auth.clone(), state.pool.clone());
    let router = router
        .route("/docs", axum::routing::get(openapi::reference_page))
        .merge(crate::api::console::router())
        .fallback(middleware::not_found)
        .method_not_allowed_fallback(middleware::method_not_allowed)
        .with_state(state)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            middleware::panic_response,
        ))
        .layer(axum::middleware::from_fn(middleware::respond_within_bound))
        .layer(axum::middleware::from_fn_with_state(
            pool,
            error::busy_or_unavailable,
        ))
        // Inside `identify`: a body is read only once its sender is known (or the route
        // is open).
        .layer(axum::middleware::from_fn_with_state(
            bodies,
            body::read_whole,
        ))
        .layer(axum::middleware::from_fn_with_state(
            auth.clone(),
            auth::identify,
        ));
    // Outside `identify`: a browser's preflight carries no credentials.
    let router = match auth.cors() {
        Some(cors) => router.layer(cors),
        None => router,
    };
    router.layer(axum::middleware::from_fn(middleware::request_context))
}

/// Where an artifact's content starts.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ContentQuery {
    /// Skip the first `offset` bytes (default 0): a reader following a growing log asks
    /// for the bytes it has not read. At or past the end: an empty body.
    #[param(minimum = 0)]
    pub(crate) offset: Option<i64>,
}

/// `limit` and `cursor` of a paginated list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub(crate) limit: Option<i64>,
    /// `next_cursor` of the previous page.
    pub(crate) cursor: Option<String>,
}

pub(crate) fn page_limit(limit: Option<i64>) -> Result<i64, ApiError> {
    match limit.unwrap_or(DEFAULT_PAGE) {
        n @ 1..=MAX_PAGE => Ok(n),
        n => Err(ApiError::invalid(format!(
            "limit must be between 1 and {MAX_PAGE}, not {n}"
        ))),
    }
}

/// A list's `order` parameter: `asc` (the default) or `desc`.
pub(crate) fn list_order(value: Option<&str>) -> Result<ListOrder, ApiError> {
    value.map_or(Ok(ListOrder::Asc), |value| {
        value
            .parse()
            .map_err(|names| ApiError::invalid(format!("order: {names}")))
    })
}

/// A list envelope from `limit + 1` fetched rows: `has_more` tells whether a next page
/// exists and `next_cursor` is what to pass as `cursor` to get it.
pub fn list<T>(mut rows: Vec<T>, limit: i64, cursor_of: impl Fn(&T) -> String) -> ListEnvelope<T> {
    let has_more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = if has_more {
        rows.last().map(cursor_of)
    } else {
        None
    };
    ListEnvelope {
        object: "list".to_string(),
        data: rows,
        has_more,
        next_cursor,
    }
}

pub(crate) fn object<T>(name: &'static str, data: T) -> ObjectEnvelope<T> {
    ObjectEnvelope {
        object: name.to_string(),
        data,
    }
}

/// An artifact's bytes as a streamed response, chunk by chunk from its content store. The
/// first chunk is read before the status is sent, so a store that cannot serve the
/// artifact at all answers with the error envelope; a failure after that cuts the body
/// short (and is logged).
pub(crate) async fn artifact_body(
    state: &AppState,
    artifact: crate::artifacts::ArtifactRecord,
    query: ContentQuery,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    use futures_util::StreamExt;

    let from = match query.offset.unwrap_or(0) {
        n @ 0.. => n,
        n => {
            return Err(ApiError::invalid(format!(
                "offset must be 0 or more, not {n}"
            )));
        }
    };
    let mut chunks = Box::pin(state.content.stream_from(
        state.pool.clone(),
        artifact.id.clone(),
        from,
    ));
    let first = chunks.next().await.transpose()?;
    let rest = chunks.inspect(|chunk| {
        if let Err(error) = chunk {
            tracing::warn!(%error, "artifact stream failed part way");
        }
    });
    let body = futures_util::stream::iter(first.map(Ok)).chain(rest);
    let headers = artifact_headers(&artifact);
    Ok((headers, axum::body::Body::from_stream(body)).into_response())
}

/// Content types a browser may render in place: none of them runs script. Everything else
/// (SVG, HTML, any other `text/*`, PDF, …) is sent as a download, so an artifact a run or a
/// vendor wrote can never execute on the API's origin.
const INLINE_CONTENT_TYPES: [&str; 7] = [
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "image/avif",
    "text/plain",
    "application/json",
];

/// The headers of an artifact's content: its type, never sniffed, in a sandbox that loads
/// nothing, and as an attachment unless the type is in [`INLINE_CONTENT_TYPES`].
fn artifact_headers(artifact: &crate::artifacts::ArtifactRecord) -> axum::http::HeaderMap {
    use axum::http::{HeaderValue, header};

    let mut headers = axum::http::HeaderMap::new();
    let content_type = HeaderValue::from_str(&artifact.content_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    let essence = artifact.content_type.split(';').next().unwrap_or_default();
    let essence = essence.trim().to_ascii_lowercase();
    if !INLINE_CONTENT_TYPES.contains(&essence.as_str()) {
        let disposition = format!(
            "attachment; filename=\"{}\"",
            download_name(&artifact.name, &artifact.id)
        );
        let disposition = HeaderValue::from_str(&disposition).expect("a sanitized file name");
        headers.insert(header::CONTENT_DISPOSITION, disposition);
    }
    headers
}

/// An artifact's name as a download's file name: letters, digits, `.`, `-` and `_` only (no
/// quotes, separators or control characters to break out of the header or the directory),
/// no leading dot, at most 100 characters; the artifact id when nothing is left.
fn download_name(name: &str, id: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' => c,
            _ => '_',
        })
        .take(100)
        .collect();
    let safe = safe.trim_start_matches('.');
    if safe.trim_matches('_').is_empty() {
        id.to_string()
    } else {
        safe.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::download_name;

    #[test]
    fn download_names_cannot_break_out() {
        assert_eq!(download_name("image-0.png", "a"), "image-0.png");
        assert_eq!(download_name("x\"; y=\r\n.svg", "a"), "x___y___.svg");
        assert_eq!(download_name("../../etc/passwd", "a"), "_.._etc_passwd");
        assert_eq!(download_name("ü中", "artifact_1"), "artifact_1");
        assert_eq!(download_name("", "artifact_1"), "artifact_1");
    }
}
