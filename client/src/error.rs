//! The client's one error type. An error answer keeps the server's envelope as sent:
//! `{"error": {"type", "message", "user_message", "operator_action", "request_id"}}`.

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API answered with an error envelope.
    #[error("{0}")]
    Api(Box<ApiError>),
    /// The API could not be reached, or the connection broke.
    #[error("cannot reach {url}: {source}")]
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

/// An error answer: its HTTP status and envelope.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ApiError {
    /// The HTTP status (not part of the envelope).
    #[serde(skip)]
    pub status: u16,
    /// The stable error type (`not_found`, `invalid_request`, `conflict`, …).
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    pub user_message: Option<String>,
    pub operator_action: Option<String>,
    pub request_id: Option<String>,
    pub trace_id: Option<String>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.status, self.kind, self.message)
    }
}

#[derive(Deserialize)]
struct Envelope {
    error: ApiError,
}

impl ApiError {
    /// The envelope of an error body; a body without one (a proxy's page) still yields an
    /// error with the status, its text as the message, and the response's request id.
    pub(crate) fn from_body(status: u16, request_id: Option<String>, body: &[u8]) -> ApiError {
        match serde_json::from_slice::<Envelope>(body) {
            Ok(Envelope { mut error }) => {
                error.status = status;
                error.request_id = error.request_id.or(request_id);
                error
            }
            Err(_) => ApiError {
                status,
                kind: "unexpected_response".into(),
                message: String::from_utf8_lossy(body).chars().take(500).collect(),
                user_message: None,
                operator_action: None,
                request_id,
                trace_id: None,
            },
        }
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
        assert_eq!(error.kind, "not_found");
        assert_eq!(error.request_id.as_deref(), Some("req_1"));
        assert_eq!(error.operator_action.as_deref(), Some("Check the id."));
        let error = ApiError::from_body(502, Some("req_2".into()), b"Bad Gateway");
        assert_eq!((error.status, error.message.as_str()), (502, "Bad Gateway"));
        assert_eq!(error.request_id.as_deref(), Some("req_2"));
    }
}
