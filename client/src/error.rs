//! The client's one error type. An error answer keeps the server's envelope as sent:
//! `{"error": {"type", "message", "user_message", "operator_action", "request_id"}}`.

use keel_api_types::{ErrorBody, ErrorEnvelope};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API answered with an error envelope.
    #[error("{0}")]
    Api(Box<ApiError>),
    /// The API could not be reached, or the connection broke.
    #[error("cannot reach {url}: {}", root_cause(source))]
    Transport {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The API accepted the connection but did not answer in time.
    #[error("no answer from {url} in time")]
    Stalled { url: String },
    /// The API answered something this client cannot read.
    #[error("unexpected answer from {url}: {message}")]
    Decode { url: String, message: String },
    /// The caller asked for something impossible before any request was sent.
    #[error("{0}")]
    Usage(String),
}

/// The innermost cause ("Connection refused"), which reqwest's own message leaves out.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

impl Error {
    /// The envelope, when the API answered with one.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Error::Api(error) => Some(error),
            _ => None,
        }
    }

    /// Whether trying again later may succeed: the API was unreachable, or answered that
    /// it cannot serve right now (5xx, 429).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport { .. } | Error::Stalled { .. } => true,
            Error::Api(error) => error.status >= 500 || error.status == 429,
            Error::Decode { .. } | Error::Usage(_) => false,
        }
    }
}

/// An error answer: its HTTP status and the envelope's body as the server sent it.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub error: ErrorBody,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.status, self.error.kind, self.error.message
        )
    }
}

impl ApiError {
    /// The envelope of an error body; a body without one (a proxy's page) still yields an
    /// error with the status, its text as the message, and the response's request id.
    pub(crate) fn from_body(status: u16, request_id: Option<String>, body: &[u8]) -> ApiError {
        let error = match serde_json::from_slice::<ErrorEnvelope>(body) {
            Ok(ErrorEnvelope { mut error }) => {
                error.request_id = error.request_id.or(request_id);
                error
            }
            Err(_) => ErrorBody {
                kind: "unexpected_response".into(),
                message: String::from_utf8_lossy(body).chars().take(500).collect(),
                user_message: "The server answered with an error that is not Keel's.".into(),
                operator_action: "Check that the URL points at Keel's API, not a proxy's page."
                    .into(),
                request_id,
                trace_id: None,
            },
        };
        ApiError { status, error }
    }
}

#[cfg(test)]
mod tests {
    use super::ApiError;

    #[test]
    fn envelope_is_kept() {
        let body = br#"{"error":{"type":"not_found","message":"task not found",
            "user_message":"The resource does not exist.","operator_action":"Check the id.",
            "request_id":"req_1"}}"#;
        let error = ApiError::from_body(404, Some("header".into()), body);
        assert_eq!(
            (error.status, error.error.kind.as_str()),
            (404, "not_found")
        );
        assert_eq!(error.error.request_id.as_deref(), Some("req_1"));
        assert_eq!(error.error.operator_action, "Check the id.");
        let error = ApiError::from_body(502, Some("req_2".into()), b"Bad Gateway");
        assert_eq!(
            (error.status, error.error.message.as_str()),
            (502, "Bad Gateway")
        );
        assert_eq!(error.error.request_id.as_deref(), Some("req_2"));
    }
}
