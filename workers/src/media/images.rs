//! The image vendors' shared flow: one synchronous `POST /images/generations`, then each
//! returned image saved as an artifact.

use serde_json::{Map, Value, json};

use super::api::VendorApi;
use super::artifacts::{self, Media};
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

/// The job's input as an object; `null` means no options.
pub(super) fn input_object(input: &Value) -> Step<Map<String, Value>> {
    match input {
        Value::Null => Ok(Map::new()),
        Value::Object(map) => Ok(map.clone()),
        _ => Err(MediaOutcome::failed(
            MediaErrorCode::InvalidRequest,
            "the job's input must be a JSON object",
        )),
    }
}

pub(super) fn copy_fields(
    input: &Map<String, Value>,
    names: &[&str],
    body: &mut Map<String, Value>,
) {
    for name in names {
        if let Some(value) = input.get(*name) {
            body.insert((*name).to_string(), value.clone());
        }
    }
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

/// `input.image` or `input.image_url`: one URL string, or a list of them.
pub(super) fn reference_images(input: &Map<String, Value>) -> Step<Option<Value>> {
    let Some(image) = input.get("image").or_else(|| input.get("image_url")) else {
        return Ok(None);
    };
    let valid = match image {
        Value::String(url) => is_image_url(url),
        Value::Array(urls) => {
            !urls.is_empty()
                && urls
                    .iter()
                    .all(|url| url.as_str().is_some_and(is_image_url))
        }
        _ => false,
    };
    if !valid {
        return Err(MediaOutcome::failed(
            MediaErrorCode::InvalidRequest,
            "input.image must be an http(s) or data URL, or a list of them",
        ));
    }
    Ok(Some(image.clone()))
}

fn is_image_url(url: &str) -> bool {
    ["http://", "https://", "data:image/"]
        .iter()
        .any(|prefix| url.starts_with(prefix))
}
