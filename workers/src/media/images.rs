//! The image vendors' shared flow: one synchronous `POST /images/generations`, its body
//! built by the vendor's own file ([`openai`](super::openai), [`seedream`](super::seedream)),
//! then each returned image saved as an artifact.

use serde_json::{Value, json};

use super::api::VendorApi;
use super::artifacts::{self, Media};
use super::input::input_object;
use super::{
    MediaArtifactKind, MediaContext, MediaErrorCode, MediaOutcome, MediaSpec, Step, Vendor, openai,
    seedream,
};

pub(super) async fn run(spec: &MediaSpec, ctx: &impl MediaContext) -> Step<()> {
    let input = input_object(&spec.input)?;
    let body = match spec.vendor {
        Vendor::Seedream => seedream::request_body(spec, &input)?,
        _ => openai::request_body(spec, &input),
    };
    let api = VendorApi::new(spec)?;
    ctx.progress(json!({"stage": "submitting", "vendor": spec.vendor.as_str()}))
        .await?;
    ctx.clear_ahead().await?;
    let response = api.post(ctx, "images/generations", &body).await?;
    let images = results(&response)?;
    if images.len() > spec.limits.max_outputs {
        return Err(MediaOutcome::failed(
            MediaErrorCode::TooManyOutputs,
            format!(
                "the vendor returned {} results; a job keeps at most {} (KEEL_MEDIA_MAX_OUTPUTS)",
                images.len(),
                spec.limits.max_outputs
            ),
        ));
    }
    ctx.progress(json!({"stage": "generated", "images": images.len()}))
        .await?;
    let mut outputs = Vec::with_capacity(images.len());
    for (index, media) in images.into_iter().enumerate() {
        let stem = format!("image-{}", index + 1);
        outputs.push(artifacts::save(ctx, spec, &stem, MediaArtifactKind::Image, media).await?);
        artifacts::check_total(&spec.limits, &outputs)?;
    }
    artifacts::write_metadata(ctx, spec, None, &outputs).await
}

/// `data[]` of an images response: each entry has `b64_json` or `url`.
fn results(response: &Value) -> Step<Vec<Media>> {
    let entries = response.get("data").and_then(Value::as_array);
    let images: Vec<Media> = entries
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let b64 = entry.get("b64_json").and_then(Value::as_str);
            let url = entry.get("url").and_then(Value::as_str);
            match (b64, url) {
                (Some(b64), _) => Some(Media::Inline(b64.to_string())),
                (None, Some(url)) => Some(Media::Url(url.to_string())),
                (None, None) => None,
            }
        })
        .collect();
    if images.is_empty() {
        return Err(MediaOutcome::failed(
            MediaErrorCode::ProviderError,
            "the vendor returned no images",
        ));
    }
    Ok(images)
}
