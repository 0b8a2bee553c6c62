//! The envelopes every response comes in: one resource, a page of a list, or an error.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A page of a list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ListEnvelope<T> {
    /// Always `list`.
    #[schema(example = "list")]
    pub object: String,
    pub data: Vec<T>,
    /// Whether another page follows.
    pub has_more: bool,
    /// Pass as `cursor` to get the next page; null on the last page.
    pub next_cursor: Option<String>,
}

impl<T> ListEnvelope<T> {
    /// The same page with each item transformed.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> ListEnvelope<U> {
        let ListEnvelope {
            object,
            data,
            has_more,
            next_cursor,
        } = self;
        ListEnvelope {
            object,
            data: data.into_iter().map(f).collect(),
            has_more,
            next_cursor,
        }
    }
}

/// One resource.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ObjectEnvelope<T> {
    /// The resource's type, for example `task` or `task_run`.
    pub object: String,
    pub data: T,
}

/// What a deletion removed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Deleted {
    #[schema(example = "task")]
    pub object: String,
    pub id: String,
    pub deleted: bool,
}

/// The error envelope every 4xx and 5xx response carries.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({ "error": {
    "type": "invalid_request", "message": "unknown field `shell_comand`, expected one of …",
    "user_message": "The request was not valid.",
    "operator_action": "Fix the request as the message says and send it again.",
    "request_id": "req_01a229b431bc7222aa7a08b65e97e649",
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"
}}))]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// Stable machine code: `invalid_request`, `unauthorized`, `forbidden`, `not_found`,
    /// `conflict`, `rate_limit_exceeded`, `internal_error`, `unavailable`, or a resource's
    /// own (`media_job_not_runnable`, `unsupported_capability`, …).
    #[serde(rename = "type")]
    #[schema(example = "invalid_request")]
    pub kind: String,
    /// What went wrong, naming the field or resource at fault.
    pub message: String,
    /// A short summary for people.
    pub user_message: String,
    /// What to do next.
    pub operator_action: String,
    /// Mirrors the `X-Request-Id` response header.
    #[schema(example = "req_01a229b431bc7222aa7a08b65e97e649")]
    pub request_id: Option<String>,
    /// The OpenTelemetry trace id of the request, present when Keel exports traces: look
    /// the request up in the tracing backend with it.
    #[schema(example = "4bf92f3577b34da6a3ce929d0e0e4736")]
    pub trace_id: Option<String>,
}

impl ErrorBody {
    /// The error's code, when it is one this contract names (a newer server may send others).
    pub fn code(&self) -> Option<crate::ErrorCode> {
        crate::ErrorCode::parse(&self.kind)
    }
}
