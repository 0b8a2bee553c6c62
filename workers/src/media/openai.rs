//! OpenAI Images: `POST /images/generations`; results come back as `b64_json` (gpt-image
//! models) or `url` (dall-e models).

use serde_json::{Map, Value};

use super::MediaSpec;
use super::input::copy_fields;

/// Request options taken from the job's input; anything else there is not OpenAI's.
const OPTIONS: &[&str] = &[
    "size",
    "n",
    "quality",
    "style",
    "background",
    "output_format",
    "output_compression",
    "moderation",
    "response_format",
    "user",
];

pub(super) fn request_body(spec: &MediaSpec, input: &Map<String, Value>) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), spec.model.clone().into());
    body.insert("prompt".into(), spec.prompt.clone().into());
    copy_fields(input, OPTIONS, &mut body);
    Value::Object(body)
}
