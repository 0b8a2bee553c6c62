//! Turning vendor results into artifacts: each image or video one artifact, and one small
//! JSON metadata artifact describing them.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use super::output::{Output, SourceKind, file_name, sniff, too_large};
use super::{
    MediaArtifactKind, MediaContext, MediaErrorCode, MediaLimits, MediaOutcome, MediaSpec, Step,
    download,
};

/// Where a vendor put one result.
pub(super) enum Media {
    /// Base64 in the response body (`b64_json`).
    Inline(String),
    /// An `http(s)` URL to download, or a `data:` URL to decode.
    Url(String),
}

/// Fails the job once its results add up to more than the limit. Checked after each
/// result, so the overshoot is at most one result (itself capped by the download limit).
pub(super) fn check_total(limits: &MediaLimits, outputs: &[Output]) -> Step<()> {
    let total: u64 = outputs.iter().map(|output| output.bytes).sum();
    if total > limits.outputs_max_bytes {
        return Err(MediaOutcome::failed(
            MediaErrorCode::OutputsTooLarge,
            format!(
                "the job's results add up to more than {} bytes (KEEL_MEDIA_OUTPUTS_MAX_BYTES)",
                limits.outputs_max_bytes
            ),
        ));
    }
    Ok(())
}

/// Writes one result as an artifact named `<stem>.<extension of its content type>`.
pub(super) async fn save(
    ctx: &impl MediaContext,
    spec: &MediaSpec,
    stem: &str,
    kind: MediaArtifactKind,
    media: Media,
) -> Step<Output> {
    match media {
        Media::Inline(b64) => {
            let bytes = decode_base64(&b64, spec.limits.download_max_bytes)?;
            write_inline(ctx, stem, kind, None, bytes, SourceKind::B64Json).await
        }
        Media::Url(url) if url.starts_with("data:") => {
            let (content_type, bytes) = decode_data_url(&url, spec.limits.download_max_bytes)?;
            write_inline(ctx, stem, kind, content_type, bytes, SourceKind::DataUrl).await
        }
        Media::Url(url) => download::fetch(ctx, &spec.limits, &url, stem, kind).await,
    }
}

async fn write_inline(
    ctx: &impl MediaContext,
    stem: &str,
    kind: MediaArtifactKind,
    content_type: Option<String>,
    bytes: Vec<u8>,
    source: SourceKind,
) -> Step<Output> {
    let content_type = content_type.unwrap_or_else(|| sniff(&bytes).to_string());
    let name = file_name(stem, &content_type);
    let artifact = ctx.open_artifact(&name, kind, &content_type).await?;
    ctx.append_artifact(&artifact, &bytes).await?;
    ctx.close_artifact(&artifact).await?;
    Ok(Output {
        name,
        kind,
        content_type,
        bytes: bytes.len() as u64,
        source,
    })
}

fn decode_base64(text: &str, max_bytes: u64) -> Step<Vec<u8>> {
    // Refuse before decoding, so an oversized body never doubles in memory.
    if (text.len() as u64 / 4).saturating_mul(3) > max_bytes {
        return Err(too_large(max_bytes));
    }
    STANDARD.decode(text.trim()).map_err(|error| {
        MediaOutcome::failed(
            MediaErrorCode::ProviderError,
            format!("the vendor returned invalid base64 media: {error}"),
        )
    })
}

/// `data:[<media type>][;base64],<data>`; only the base64 form carries binary media.
fn decode_data_url(url: &str, max_bytes: u64) -> Step<(Option<String>, Vec<u8>)> {
    let invalid = || {
        MediaOutcome::failed(
            MediaErrorCode::ProviderError,
            "the vendor returned a data URL that is not base64 media",
        )
    };
    let (header, data) = url["data:".len()..].split_once(',').ok_or_else(invalid)?;
    let media_type = header.strip_suffix(";base64").ok_or_else(invalid)?;
    let content_type = (!media_type.is_empty()).then(|| media_type.to_string());
    Ok((content_type, decode_base64(data, max_bytes)?))
}

/// The run's `metadata.json`. It describes the request and its outputs; it holds neither
/// the api key nor any header, and no media URL (those are often pre-signed).
pub(super) async fn write_metadata(
    ctx: &impl MediaContext,
    spec: &MediaSpec,
    task_id: Option<&str>,
    outputs: &[Output],
) -> Step<()> {
    let outputs: Vec<Value> = outputs
        .iter()
        .map(|output| {
            json!({
                "artifact": output.name,
                "kind": output.kind.as_str(),
                "content_type": output.content_type,
                "bytes": output.bytes,
                "source": output.source.as_str(),
            })
        })
        .collect();
    let metadata = json!({
        "vendor": spec.vendor.as_str(),
        "model": spec.model,
        "operation": spec.operation.as_str(),
        "vendor_task_id": task_id,
        "outputs": outputs,
    });
    let bytes = serde_json::to_vec_pretty(&metadata).expect("JSON values serialize");
    let artifact = ctx
        .open_artifact(
            "metadata.json",
            MediaArtifactKind::Metadata,
            "application/json",
        )
        .await?;
    ctx.append_artifact(&artifact, &bytes).await?;
    ctx.close_artifact(&artifact).await?;
    Ok(())
}
