//! A typed client of Keel's HTTP API (`/v1`): one [`Client`] with a method per operation,
//! named by its OpenAPI `operationId` (`tests/it/parity.rs` fails on an operation without
//! its method), errors that keep the server's envelope ([`Error`]), a
//! paginating stream over every list ([`Call::items`]), event streams that resume with
//! `Last-Event-ID` after a dropped connection ([`sse`]), and an artifact content reader.
//!
//! Every operation but the two event streams returns a [`Call`]: await it for the typed value, or call
//! [`Call::raw`] for the API's JSON exactly as the server sent it
//! ([`Call::send_with_status`] and [`Call::raw_with_status`] add the success status).

mod call;
mod error;
mod ops;
pub mod sse;
pub mod types;

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

pub use call::Call;
pub use error::{ApiError, Error};
pub use types::*;

/// The address `keel serve` and `keel api` listen on by default.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8420";
/// How long a request may take when the caller does not say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How the client proves who it is.
#[derive(Clone, Default)]
pub enum Credentials {
    /// None: a local-mode API on a loopback address.
    #[default]
    None,
    /// The runtime token, sent as `Authorization: Bearer`.
    RuntimeToken(String),
    /// A signed identity from a trusted proxy, sent as `X-Keel-Identity`.
    Identity(String),
}

impl std::fmt::Debug for Credentials {
    // Never the secret itself: a client may end up in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credentials::None => "None",
            Credentials::RuntimeToken(_) => "RuntimeToken(…)",
            Credentials::Identity(_) => "Identity(…)",
        })
    }
}

/// A client of one Keel API. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The base URL without a trailing slash; paths start with `/v1`.
    base: String,
    timeout: Duration,
}

impl Client {
    /// A client of the API at `base_url` (for example `http://127.0.0.1:8420`).
    pub fn new(base_url: &str, credentials: Credentials, timeout: Duration) -> Result<Self, Error> {
        Client::with_headers(base_url, credentials, HeaderMap::new(), timeout)
    }

    /// [`Client::new`] sending `headers` with every request too: what a deployment's proxy
    /// adds, such as the header form of a remote identity (`X-Keel-Remote-Secret`,
    /// `X-Keel-Actor-Id`, …). The credential's header wins over one of the same name here.
    pub fn with_headers(
        base_url: &str,
        credentials: Credentials,
        mut headers: HeaderMap,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let base = base_url.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::Usage(format!(
                "the API URL must start with http:// or https://, not '{base_url}'"
            )));
        }
        let credential = match credentials {
            Credentials::None => None,
            Credentials::RuntimeToken(token) => {
                Some((reqwest::header::AUTHORIZATION, format!("Bearer {token}")))
            }
            Credentials::Identity(jwt) => Some((HeaderName::from_static("x-keel-identity"), jwt)),
        };
        if let Some((name, value)) = credential {
            let mut value = HeaderValue::from_str(&value)
                .map_err(|_| Error::Usage("the credential must be visible ASCII".into()))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        // No overall timeout on the client: streams stay open for as long as a run lasts.
        // Each plain request gets `timeout` instead (see `Call`).
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .redirect(same_origin_redirects())
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|source| Error::Transport {
                url: base_url.to_string(),
                source,
            })?;
        Ok(Client {
            http,
            base,
            timeout,
        })
    }

    /// The base URL this client talks to.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// A request to any route, answered with the API's JSON: for bridges that take routes
    /// from the OpenAPI document rather than from this crate (`keel rpc`).
    pub fn request(
        &self,
        method: reqwest::Method,
        path: String,
        query: Vec<(String, String)>,
        headers: Vec<(String, String)>,
        body: Option<serde_json::Value>,
    ) -> Call<'_, serde_json::Value> {
        Call::route(self, method, path, query, headers, body)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Redirects are followed within the API's origin alone (at most 10): the credential is a
/// default header, which reqwest sends on every hop and strips only when it is
/// `Authorization`, so a redirect to another host would hand it `X-Keel-Identity`.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let first = attempt.previous()[0].origin();
        if attempt.url().origin() != first {
            let refused = format!(
                "refusing a redirect to {}: it leaves the API's origin, and the credential \
                 would go with it",
                attempt.url().origin().ascii_serialization()
            );
            attempt.error(refused)
        } else if attempt.previous().len() > 10 {
            attempt.error("more than 10 redirects")
        } else {
            attempt.follow()
        }
    })
}

/// A path segment, percent-encoded: ids come from users and must not add segments.
pub fn segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for byte in id.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_stay_one_segment() {
        assert_eq!(super::segment("task_01ab"), "task_01ab");
        assert_eq!(super::segment("../x y"), "..%2Fx%20y");
    }
}
