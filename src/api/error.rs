//! The one error type of the HTTP layer and the envelope every error response carries:
//! `{"error": {"type", "message", "user_message", "operator_action", "request_id",
//! "trace_id"}}` (`trace_id` only when the request is traced).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use keel_api_types::ErrorCode;

use crate::db::StoreError;
use crate::domain::Invalid;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    Invalid { status: StatusCode, message: String },
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// A conflict whose `operator_action` says what to do about this one.
    #[error("{message}")]
    ConflictNext { message: String, next: String },
    /// Refused with an error type of its own (`media_job_not_runnable`,
    /// `unsupported_capability`, …), for clients that branch on it.
    #[error("{message}")]
    Coded {
        status: StatusCode,
        code: ErrorCode,
        message: String,
    },
    #[error("internal error: {0}")]
    Internal(String),
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// No connection came within the acquire timeout. sqlx says the same whether the
    /// database did not answer or every connection was busy: [`busy_or_unavailable`]
    /// asks the pool which, and answers [`ApiError::Busy`] or as `Unavailable`.
    #[error("the database is unavailable: no connection within the acquire timeout")]
    NoConnection,
    /// No connection of this process's pool came free within the acquire timeout while
    /// every one was open and in use: the database answers, this process is saturated.
    #[error("every database connection of this process is in use")]
    Busy,
    /// No valid credentials. The reason is for the log: the client hears the same message
    /// whatever was wrong, so a guess learns nothing.
    #[error("unauthorized: {0}")]
    Unauthorized(&'static str),
    #[error("{0}")]
    Forbidden(String),
    /// The caller's rate limit is spent; it refills in `retry_after` seconds.
    #[error("rate limit exceeded: retry in {retry_after} s")]
    RateLimited { retry_after: u64 },
    /// The caller holds as many open streams as one identity may.
    #[error("{max} streams are open for this identity already: close one first")]
    TooManyStreams { max: usize },
}

impl ApiError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        ApiError::Invalid {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    pub(crate) fn method_not_allowed(method: &axum::http::Method, path: &str) -> Self {
        ApiError::Invalid {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("method {method} is not allowed on {path}"),
        }
    }

    fn parts(&self) -> (StatusCode, ErrorCode, &'static str, &'static str) {
        match self {
            ApiError::Invalid { status, .. } => (
                *status,
                ErrorCode::InvalidRequest,
                "The request is not valid.",
                "Fix the request as the message says and send it again.",
            ),
            ApiError::NotFound(_) => (
                StatusCode::NOT_FOUND,
                ErrorCode::NotFound,
                "The resource does not exist.",
                "Check the id; list the collection to find existing resources.",
            ),
            ApiError::Conflict(_) | ApiError::ConflictNext { .. } => (
                StatusCode::CONFLICT,
                ErrorCode::Conflict,
                "The resource is not in a state that allows this.",
                "Reload the resource, then retry if the action still applies.",
            ),
            ApiError::Coded { status, code, .. } => (
                *status,
                *code,
                "The resource cannot do this now.",
                "Read the message and the error type; fix the resource or the request.",
            ),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::InternalError,
                "Keel failed to handle the request.",
                "Retry; if it persists, look up the request id in the server logs.",
            ),
            ApiError::Unavailable(_) | ApiError::NoConnection => (
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                "Keel cannot reach its database.",
                "Check that PostgreSQL is running and reachable, then retry.",
            ),
            ApiError::Busy => (
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                "Keel is too busy to take this request now.",
                "Retry after the seconds in Retry-After. If it lasts, raise \
                 KEEL_DB_MAX_CONNECTIONS (within the database's max_connections) or run \
                 another API process.",
            ),
            ApiError::Unauthorized(_) => (
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthorized,
                "The request did not prove who sent it.",
                "Send the runtime token (Authorization: Bearer, or X-Keel-Runtime-Token; \
                 `keel serve` keeps its own in runtime-token in its data directory, which \
                 `keel` commands read from the directory it was started in), or in remote \
                 mode the identity from the trusted proxy.",
            ),
            ApiError::Forbidden(_) => (
                StatusCode::FORBIDDEN,
                ErrorCode::Forbidden,
                "This request is not allowed here.",
                "Read the message: the host, the route or the caller is not allowed.",
            ),
            ApiError::RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::RateLimitExceeded,
                "Too many requests for this identity.",
                "Wait for the seconds in Retry-After, then retry.",
            ),
            ApiError::TooManyStreams { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::RateLimitExceeded,
                "Too many open streams for this identity.",
                "Close a stream you no longer read (each run page, `keel watch` and feed \
                 reader holds one), then retry; KEEL_MAX_STREAMS_PER_IDENTITY sets the cap.",
            ),
        }
    }
}

impl From<Invalid> for ApiError {
    fn from(invalid: Invalid) -> Self {
        ApiError::Invalid {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            message: invalid.to_string(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound(what) => ApiError::NotFound(what.to_string()),
            StoreError::Conflict(message) => ApiError::Conflict(message),
            StoreError::ConflictNext { message, next } => ApiError::ConflictNext { message, next },
            StoreError::Refused { code, message } => ApiError::Coded {
                status: StatusCode::CONFLICT,
                code,
                message,
            },
            StoreError::Unprocessable { code, message } => ApiError::Coded {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                code,
                message,
            },
            StoreError::Forbidden(message) => ApiError::Forbidden(message),
            StoreError::QuotaExceeded(message) => ApiError::Coded {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: ErrorCode::StorageQuotaExceeded,
                message,
            },
            StoreError::LeaseLost => ApiError::Internal(error.to_string()),
            StoreError::Database(sqlx::Error::PoolTimedOut) => ApiError::NoConnection,
            StoreError::Database(e @ (sqlx::Error::Io(_) | sqlx::Error::PoolClosed)) => {
                ApiError::Unavailable(e.to_string())
            }
            StoreError::Database(e) if is_unstorable_text(&e) => ApiError::invalid(
                "text must not contain NUL characters (\\u0000); PostgreSQL cannot store them",
            ),
            StoreError::Database(e) => ApiError::Internal(e.to_string()),
            StoreError::Content(_) => ApiError::Internal(error.to_string()),
        }
    }
}

/// PostgreSQL refuses text it cannot store (a NUL character): the client's input is at
/// fault, wherever in the request it came from.
fn is_unstorable_text(error: &sqlx::Error) -> bool {
    const CHARACTER_NOT_IN_REPERTOIRE: &str = "22021";
    const UNTRANSLATABLE_CHARACTER: &str = "22P05";
    matches!(error, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some(CHARACTER_NOT_IN_REPERTOIRE | UNTRANSLATABLE_CHARACTER)))
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> Self {
        StoreError::from(error).into()
    }
}

/// The envelope, without request and trace ids: the request middleware fills them in.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, kind, user_message, operator_action) = self.parts();
        let message = match &self {
            // Internal details go to the log (by the middleware), never to the client.
            ApiError::Internal(_) => "internal error".to_string(),
            ApiError::Unavailable(_) | ApiError::NoConnection => {
                "the database is unavailable".to_string()
            }
            ApiError::Unauthorized(_) => "missing or invalid credentials".to_string(),
            other => other.to_string(),
        };
        let operator_action = match &self {
            ApiError::ConflictNext { next, .. } => next.as_str(),
            _ => operator_action,
        };
        let body = json!({ "error": {
            "type": kind.as_str(),
            "message": message,
            "user_message": user_message,
            "operator_action": operator_action,
        }});
        let mut response = (status, Json(body)).into_response();
        let retry_after = match self {
            ApiError::RateLimited { retry_after } => Some(retry_after),
            ApiError::TooManyStreams { .. } => Some(STREAMS_RETRY_AFTER_SECS),
            ApiError::Unavailable(_) | ApiError::NoConnection => Some(UNAVAILABLE_RETRY_AFTER_SECS),
            ApiError::Busy => Some(BUSY_RETRY_AFTER_SECS),
            _ => None,
        };
        if let Some(retry_after) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, retry_after.into());
        }
        if matches!(self, ApiError::NoConnection) {
            response.extensions_mut().insert(WaitedForConnection);
        }
        response
            .extensions_mut()
            .insert(ErrorDetail(self.to_string()));
        response
    }
}

/// When a client should try again after a busy 503: a connection frees as soon as a
/// request in flight ends.
const BUSY_RETRY_AFTER_SECS: u64 = 1;

/// Marks the response of an [`ApiError::NoConnection`] for [`busy_or_unavailable`].
#[derive(Clone, Copy)]
struct WaitedForConnection;

/// Turns a 503 for a connection wait into [`ApiError::Busy`] when the pool is full and
/// every connection is in use: those connections opened, so the database answered, and
/// its clients are told to retry soon rather than to check PostgreSQL.
pub(crate) async fn busy_or_unavailable(
    axum::extract::State(pool): axum::extract::State<sqlx::PgPool>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    if response.extensions().get::<WaitedForConnection>().is_none() {
        return response;
    }
    let saturated = pool.size() >= pool.options().get_max_connections() && pool.num_idle() == 0;
    if saturated {
        ApiError::Busy.into_response()
    } else {
        response
    }
}

/// When a client should try again after a 503: a failover or a partition's heal takes
/// seconds, and every process reconnects by itself.
const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 5;

/// When a client over its stream cap should try again: a slot frees when one of its own
/// streams ends, which nothing predicts, so this only keeps a reconnecting client from
/// asking in a tight loop.
const STREAMS_RETRY_AFTER_SECS: u64 = 5;

/// The full error text, kept on the response for the logging middleware.
#[derive(Clone)]
pub(crate) struct ErrorDetail(pub(crate) String);

/// A workflow that cannot be used answers 422 with its class as the error type
/// (`missing_workflow_file`, `workflow_parse_error`, …).
impl From<crate::external::workflow::WorkflowError> for ApiError {
    fn from(error: crate::external::workflow::WorkflowError) -> Self {
        ApiError::Coded {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: error.code(),
            message: error.to_string(),
        }
    }
}

impl From<crate::external::workflow::ExternalError> for ApiError {
    fn from(error: crate::external::workflow::ExternalError) -> Self {
        use crate::external::workflow::ExternalError;
        match error {
            ExternalError::Workflow(e) => e.into(),
            ExternalError::Unusable(message) => ApiError::Invalid {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                message,
            },
            ExternalError::Store(e) => e.into(),
        }
    }
}
