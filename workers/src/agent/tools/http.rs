//! http_request: network egress for the model, over http(s) to public addresses only,
//! through the media downloads' address filter (every resolved address checked at connect
//! time, every redirect re-checked), with a timeout and a bounded read of the response.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Client, Method};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use url::Url;

use super::{Done, ToolEnv, ToolError};
use crate::media::egress::{check_url, checked_redirects, guarded, refusal};

/// Response bytes read at most (the result is cut further to the output limit).
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HttpRequest {
    method: String,
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    body: Option<String>,
}

pub(super) async fn http_request(
    env: &ToolEnv,
    args: HttpRequest,
    cancel: &CancellationToken,
) -> Result<Done, ToolError> {
    if !env.sandbox.network {
        return Err(
            "http_request is refused: this run has no network (sandbox_network false)".into(),
        );
    }
    let url = Url::parse(&args.url).map_err(|e| format!("not a valid URL: {e}"))?;
    let allow_private = env.allow_private_addresses;
    check_url(&url, allow_private).map_err(|why| format!("refused: {why}"))?;
    let method = Method::from_bytes(args.method.to_ascii_uppercase().as_bytes())
        .map_err(|_| format!("not an HTTP method: {:?}", args.method))?;
    let builder = Client::builder()
        .redirect(checked_redirects(allow_private))
        .timeout(env.call_timeout);
    let client = guarded(builder, allow_private)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let mut request = client.request(method, url);
    for (name, value) in &args.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("not a valid header name: {name:?}"))?;
        // The value is not echoed: it may be a credential.
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("the value of header {name} is not a valid header value"))?;
        request = request.header(name, value);
    }
    if let Some(body) = args.body {
        request = request.body(body);
    }
    let exchange = async {
        let response = request.send().await.map_err(failure)?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let mut body = Vec::new();
        let mut total = 0usize;
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(failure)?;
            total += chunk.len();
            let room = MAX_RESPONSE_BYTES
                .saturating_sub(body.len())
                .min(chunk.len());
            body.extend_from_slice(&chunk[..room]);
            if total > MAX_RESPONSE_BYTES {
                break;
            }
        }
        let mut content = format!("HTTP {status}\ncontent-type: {content_type}\n\n");
        content.push_str(&String::from_utf8_lossy(&body));
        if total > body.len() {
            content.push_str(&format!("\n[… truncated: read {MAX_RESPONSE_BYTES} bytes]"));
        }
        Ok::<_, ToolError>(Done {
            content,
            failed: !status.is_success(),
            patches: Vec::new(),
        })
    };
    tokio::select! {
        done = exchange => done,
        _ = cancel.cancelled() => Err("the tool call was cancelled".into()),
    }
}

fn failure(error: reqwest::Error) -> ToolError {
    if let Some(why) = refusal(&error) {
        return format!("refused: {why}").into();
    }
    let kind = if error.is_timeout() {
        "timed out"
    } else {
        "failed"
    };
    // Without the URL: its query may carry a credential the model was given.
    format!("the request {kind}: {}", error.without_url()).into()
}
