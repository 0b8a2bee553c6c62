//! Seedream on BytePlus ModelArk / Volcengine Ark: `POST /images/generations`, the same
//! path as OpenAI's, with `image` (a URL or a data URL, or a list of them) for edits.

use serde_json::{Map, Value};

use super::input::{copy_fields, reference_images};
use super::{MediaErrorCode, MediaOutcome, MediaSpec, Operation, Step};

const OPTIONS: &[&str] = &[
    "size",
    "seed",
    "sequential_image_generation",
    "sequential_image_generation_options",
    "watermark",
    "guidance_scale",
    "response_format",
    "output_format",
    "optimize_prompt_options",
];

pub(super) fn request_body(spec: &MediaSpec, input: &Map<String, Value>) -> Step<Value> {
    let mut body = Map::new();
    body.insert("model".into(), spec.model.clone().into());
    body.insert("prompt".into(), spec.prompt.clone().into());
    // URLs keep large results out of the JSON body; the download streams them instead.
    body.insert("response_format".into(), "url".into());
    copy_fields(input, OPTIONS, &mut body);
    match (reference_images(input)?, spec.operation) {
        (Some(image), _) => {
            body.insert("image".into(), image);
        }
        (None, Operation::ImageEdit) => {
            return Err(MediaOutcome::failed(
                MediaErrorCode::InvalidRequest,
                "image_edit needs input.image or input.image_url (an http(s) or data URL)",
            ));
        }
        (None, _) => {}
    }
    Ok(Value::Object(body))
}
