//! Reading a job's input for a vendor request: the input as an object, the vendor's
//! options copied from it, and the reference images an edit or a video starts from.

use serde_json::{Map, Value};

use super::{MediaErrorCode, MediaOutcome, Step};

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
