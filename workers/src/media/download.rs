//! Downloading result media from URLs a vendor returned, each streamed into an artifact.
//! The URL is untrusted: the client carries no credentials, speaks only http(s), and (unless
//! the limits allow it) reaches only public addresses, checked on every connection and every
//! redirect by the [`egress`](super::egress) filter.

use futures_util::StreamExt;
use reqwest::Client;
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use serde_json::json;
use tracing::Instrument;
use url::Url;

use super::api::vendor_span;
use super::egress::{check_url, checked_redirects, describe, guarded, refusal};
use super::output::{Output, SourceKind, file_name, sniff, too_large};
use super::{
    MediaArtifactKind, MediaContext, MediaErrorCode, MediaLimits, MediaOutcome, Step, cancellable,
};

/// Streams `url` into a new artifact named after `stem` and the media's content type.
pub(super) async fn fetch(
    ctx: &impl MediaContext,
    limits: &MediaLimits,
    url: &str,
    stem: &str,
    kind: MediaArtifactKind,
) -> Step<Output> {
    let url = Url::parse(url).map_err(|_| refused("the media URL is not a valid URL"))?;
    check_url(&url, limits.allow_private_addresses).map_err(|why| refused(&why.0))?;
    ctx.progress(json!({"stage": "downloading", "kind": kind.as_str()}))
        .await?;
    // A download URL's path may be a signed token: the span names its host only.
    let span = vendor_span(&reqwest::Method::GET, &url, false);
    let request = client(limits)?.get(url).timeout(limits.download_timeout);
    let response = cancellable(ctx, request.send())
        .instrument(span.clone())
        .await?
        .map_err(download_error)?;
    span.record("http.response.status_code", response.status().as_u16());
    check_status(response.status())?;
    if response
        .content_length()
        .is_some_and(|length| length > limits.download_max_bytes)
    {
        return Err(too_large(limits.download_max_bytes));
    }
    let declared = media_type(response.headers(), kind);
    let mut body = response.bytes_stream();
    let Some(first) = next_chunk(ctx, &mut body).await? else {
        return Err(MediaOutcome::failed(
            MediaErrorCode::ProviderError,
            "the media download was empty",
        ));
    };
    let content_type = declared.unwrap_or_else(|| sniff(&first).to_string());
    let name = file_name(stem, &content_type);
    let artifact = ctx.open_artifact(&name, kind, &content_type).await?;
    let mut written = 0u64;
    let mut chunk = Some(first);
    while let Some(bytes) = chunk {
        written += bytes.len() as u64;
        if written > limits.download_max_bytes {
            return Err(too_large(limits.download_max_bytes));
        }
        ctx.append_artifact(&artifact, &bytes).await?;
        chunk = next_chunk(ctx, &mut body).await?;
    }
    ctx.close_artifact(&artifact).await?;
    ctx.progress(json!({"stage": "downloaded", "artifact": name, "bytes": written}))
        .await?;
    Ok(Output {
        name,
        kind,
        content_type,
        bytes: written,
        source: SourceKind::Url,
    })
}

async fn next_chunk(
    ctx: &impl MediaContext,
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
) -> Step<Option<bytes::Bytes>> {
    match cancellable(ctx, body.next()).await? {
        Some(Ok(bytes)) => Ok(Some(bytes)),
        Some(Err(error)) => Err(download_error(error)),
        None => Ok(None),
    }
}

/// The server's content type when it names media of the expected kind; generic types
/// (`application/octet-stream`, common on object stores) are left to sniffing.
fn media_type(headers: &HeaderMap, kind: MediaArtifactKind) -> Option<String> {
    let value = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next()?.trim().to_ascii_lowercase();
    let prefix = match kind {
        MediaArtifactKind::Video => "video/",
        _ => "image/",
    };
    essence.starts_with(prefix).then_some(essence)
}

fn check_status(status: reqwest::StatusCode) -> Step<()> {
    if status.is_success() {
        return Ok(());
    }
    let message = format!("the media download returned HTTP {}", status.as_u16());
    if status.is_server_error() || status.as_u16() == 408 || status.as_u16() == 429 {
        Err(MediaOutcome::retry(
            MediaErrorCode::ProviderUnavailable,
            message,
        ))
    } else {
        Err(MediaOutcome::failed(MediaErrorCode::ProviderError, message))
    }
}

fn client(limits: &MediaLimits) -> Step<Client> {
    let allow_private = limits.allow_private_addresses;
    let builder = Client::builder().redirect(checked_redirects(allow_private));
    guarded(builder, allow_private).build().map_err(|error| {
        MediaOutcome::retry(
            MediaErrorCode::ProviderUnavailable,
            format!("cannot build the download client: {}", describe(&error)),
        )
    })
}

fn download_error(error: reqwest::Error) -> MediaOutcome {
    // The URL may be pre-signed: its query is a credential.
    let error = error.without_url();
    if let Some(why) = refusal(&error) {
        return refused(&why.0);
    }
    let message = format!("the media download failed: {}", describe(&error));
    if error.is_timeout() {
        MediaOutcome::retry(MediaErrorCode::Timeout, message)
    } else {
        MediaOutcome::retry(MediaErrorCode::ProviderUnavailable, message)
    }
}

fn refused(why: &str) -> MediaOutcome {
    MediaOutcome::failed(
        MediaErrorCode::DownloadRefused,
        format!("refused to download the media: {why}"),
    )
}
