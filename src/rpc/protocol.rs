//! The wire format (seed 002): one JSON object per line, each with `"v": 1`. A host sends
//! `{v, id, method, params}`; Keel answers `{v, id, result}` or `{v, id, error: {code,
//! message, hint}}`, and pushes `{v, subscription, event}` and `{v, notice}` lines.

use serde::Serialize;
use serde_json::{Map, Value, json};

/// The protocol version every line carries.
pub(crate) const VERSION: u64 = 1;

/// The longest line read; a longer one is answered with `line_too_long` and skipped.
pub(crate) const MAX_LINE_BYTES: usize = 1024 * 1024;

/// A failed request, as the host sees it. `code` is stable: the protocol's own codes
/// below, or the API envelope's `type` (`not_found`, `invalid_request`, …) passed through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RpcError {
    pub(crate) code: String,
    pub(crate) message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hint: Option<String>,
}

/// The protocol's own error codes.
pub(crate) mod code {
    /// The line is not JSON.
    pub(crate) const PARSE_ERROR: &str = "parse_error";
    /// The line is JSON but not a request (not an object, no `id`, no `method`, …).
    pub(crate) const INVALID_REQUEST: &str = "invalid_request";
    /// `v` is missing or not 1.
    pub(crate) const UNSUPPORTED_VERSION: &str = "unsupported_version";
    /// The line is longer than [`MAX_LINE_BYTES`](crate::rpc::MAX_LINE_BYTES).
    pub(crate) const LINE_TOO_LONG: &str = "line_too_long";
    pub(crate) const METHOD_NOT_FOUND: &str = "method_not_found";
    /// The params do not fit the method (see `harness.methods`).
    pub(crate) const INVALID_PARAMS: &str = "invalid_params";
    /// The Keel API could not be reached, or answered something unreadable.
    pub(crate) const UNAVAILABLE: &str = "unavailable";
    /// No such subscription in this session.
    pub(crate) const NOT_FOUND: &str = "not_found";
    /// The session already holds the most subscriptions it may.
    pub(crate) const TOO_MANY_SUBSCRIPTIONS: &str = "too_many_subscriptions";
}

impl RpcError {
    pub(crate) fn new(code: &str, message: impl Into<String>) -> Self {
        RpcError {
            code: code.to_string(),
            message: message.into(),
            hint: None,
        }
    }

    pub(crate) fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

/// A request line, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Request {
    pub(crate) id: Value,
    pub(crate) method: String,
    pub(crate) params: Map<String, Value>,
}

/// A line that is not a request: the error to answer with, and the id to answer to
/// (null when the line had no usable one).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refused {
    pub(crate) id: Value,
    pub(crate) error: RpcError,
}

/// Parses one line into a request.
pub(crate) fn parse(line: &str) -> Result<Request, Refused> {
    let refuse = |id: &Value, code: &str, message: &str| Refused {
        id: id.clone(),
        error: RpcError::new(code, message),
    };
    let value: Value = serde_json::from_str(line).map_err(|error| {
        refuse(
            &Value::Null,
            code::PARSE_ERROR,
            &format!("not JSON: {error}"),
        )
    })?;
    let Value::Object(mut object) = value else {
        return Err(refuse(
            &Value::Null,
            code::INVALID_REQUEST,
            "a request is a JSON object",
        ));
    };
    let id = match object.remove("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id,
        _ => {
            let message = "a request needs an `id` (a string or a number)";
            return Err(refuse(&Value::Null, code::INVALID_REQUEST, message));
        }
    };
    if object.get("v").and_then(Value::as_u64) != Some(VERSION) {
        let message =
            format!("this server speaks protocol version {VERSION}; send \"v\": {VERSION}");
        return Err(refuse(&id, code::UNSUPPORTED_VERSION, &message));
    }
    let Some(Value::String(method)) = object.remove("method") else {
        return Err(refuse(
            &id,
            code::INVALID_REQUEST,
            "a request needs a `method` string",
        ));
    };
    let params = match object.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(params)) => params,
        Some(_) => {
            return Err(refuse(
                &id,
                code::INVALID_PARAMS,
                "`params` is an object when present",
            ));
        }
    };
    Ok(Request { id, method, params })
}

/// The line answering `id` with a result.
pub(crate) fn result_line(id: &Value, result: &Value) -> String {
    line(json!({"v": VERSION, "id": id, "result": result}))
}

/// The line answering `id` with an error.
pub(crate) fn error_line(id: &Value, error: &RpcError) -> String {
    line(json!({"v": VERSION, "id": id, "error": error}))
}

/// A pushed event of a subscription: one the API had already persisted.
pub(crate) fn event_line(subscription: &str, event: &Value) -> String {
    line(json!({"v": VERSION, "subscription": subscription, "event": event}))
}

/// A non-fatal condition the host may want to know about.
pub(crate) fn notice_line(notice: &Value) -> String {
    line(json!({"v": VERSION, "notice": notice}))
}

fn line(value: Value) -> String {
    let mut line = value.to_string();
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(line: &str) -> (Value, String) {
        let refused = parse(line).expect_err(line);
        (refused.id, refused.error.code)
    }

    #[test]
    fn a_request_needs_every_part() {
        let request = parse(r#"{"v":1,"id":7,"method":"tasks.get","params":{"task_id":"t"}}"#)
            .expect("a request");
        assert_eq!(request.id, json!(7));
        assert_eq!(request.method, "tasks.get");
        assert_eq!(request.params["task_id"], "t");
        assert!(parse(r#"{"v":1,"id":"a","method":"daemon.status"}"#).is_ok());

        assert_eq!(refused("{nope"), (Value::Null, "parse_error".into()));
        assert_eq!(refused("[1]"), (Value::Null, "invalid_request".into()));
        assert_eq!(
            refused(r#"{"v":1,"method":"x"}"#),
            (Value::Null, "invalid_request".into())
        );
        assert_eq!(
            refused(r#"{"v":1,"id":{},"method":"x"}"#).1,
            "invalid_request"
        );
        assert_eq!(
            refused(r#"{"v":2,"id":1,"method":"x"}"#),
            (json!(1), "unsupported_version".into())
        );
        assert_eq!(refused(r#"{"id":1,"method":"x"}"#).1, "unsupported_version");
        assert_eq!(
            refused(r#"{"v":1,"id":1}"#),
            (json!(1), "invalid_request".into())
        );
        assert_eq!(
            refused(r#"{"v":1,"id":1,"method":"x","params":[]}"#).1,
            "invalid_params"
        );
    }

    #[test]
    fn lines_are_one_json_object_each() {
        let error = RpcError::new("not_found", "no such task").with_hint("list tasks");
        for line in [
            result_line(&json!(1), &json!({"a": "b\nc"})),
            error_line(&json!("x"), &error),
            event_line("sub_1", &json!({"id": "1"})),
            notice_line(&json!({"kind": "k"})),
        ] {
            assert!(
                line.ends_with('\n') && line.matches('\n').count() == 1,
                "{line}"
            );
            let value: Value = serde_json::from_str(&line).expect("JSON");
            assert_eq!(value["v"], 1);
        }
        let value: Value = serde_json::from_str(&error_line(&json!("x"), &error)).expect("JSON");
        assert_eq!(
            value["error"],
            json!({"code": "not_found", "message": "no such task", "hint": "list tasks"})
        );
    }
}
