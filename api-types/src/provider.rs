//! Provider presets: reusable, non-secret provider configuration, named secrets by
//! reference only, and what checking a preset or a reference tells.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};

use crate::schema::{
    HTTP_BASE_URL, JsonObject, NO_CONTROL, one_of_strings, secret_ref, string, string_map,
};

/// The input kinds a preset may list.
pub const PROVIDER_INPUTS: [&str; 3] = ["text", "image", "video"];

/// A preset header's name, as the server's `header_name` takes one: letters, digits, `-`
/// and `_` (a subset of HTTP's token characters).
pub const PROVIDER_HEADER_NAME: &str = "^[A-Za-z0-9_-]+$";

/// A preset as the API shows it: its fields, and whether its secrets resolve here.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProviderView {
    #[schema(example = "provider_0190...")]
    pub id: String,
    /// `openai-images`, `seedream` or `seedance` for media presets; any slug for chat ones.
    pub kind: String,
    pub display_name: String,
    pub provider_id: String,
    pub model: String,
    #[schema(value_type = String, example = "media-job")]
    pub api: String,
    pub base_url: String,
    pub api_key_ref: Option<String>,
    /// Whether `api_key_ref` resolves in the API process answering.
    pub api_key_configured: bool,
    pub api_key_status: Option<SecretStatus>,
    pub headers: BTreeMap<String, String>,
    pub secret_header_refs: BTreeMap<String, String>,
    pub capabilities: Vec<String>,
    pub input: Vec<String>,
    #[schema(value_type = Object)]
    pub compat: serde_json::Map<String, serde_json::Value>,
    pub enabled: bool,
    /// The result of the last `POST /providers/{id}/check`; cleared by any edit.
    #[schema(value_type = Option<Object>)]
    pub last_check: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A preset to create. A raw API key is never accepted: name it with `api_key_ref`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderDraft {
    /// `openai-images`, `seedream` or `seedance` for media presets; any slug for chat ones.
    #[schema(example = "seedance", pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    pub kind: String,
    pub display_name: Option<String>,
    /// A slug; absent: the preset's `kind`.
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    pub provider_id: Option<String>,
    #[schema(
        example = "seedance-1-0-pro-250528",
        pattern = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$",
        max_length = 200
    )]
    pub model: String,
    #[schema(schema_with = api_schema)]
    pub api: String,
    /// An http or https URL without credentials, query or fragment (IPv6 hosts are not
    /// stated); a media preset's host must be its vendor's documented one or in
    /// KEEL_PROVIDER_HOSTS (422 otherwise).
    #[schema(schema_with = base_url_schema)]
    pub base_url: String,
    /// `env:NAME`, `file:/absolute/path` or `keychain:NAME`, allowed by the operator's
    /// secret policy (422 otherwise).
    #[schema(example = "env:ARK_API_KEY", schema_with = nullable_secret_ref)]
    pub api_key_ref: Option<String>,
    #[serde(default)]
    #[schema(schema_with = headers_schema)]
    pub headers: BTreeMap<String, String>,
    /// Header name → secret reference.
    #[serde(default)]
    #[schema(schema_with = secret_headers_schema)]
    pub secret_header_refs: BTreeMap<String, String>,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    #[schema(schema_with = inputs_schema)]
    pub input: Vec<String>,
    #[serde(default)]
    #[schema(value_type = JsonObject)]
    pub compat: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub enabled: bool,
}

/// Fields to change; absent fields stay. `api_key_ref: null` removes the reference.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderPatch {
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    pub kind: Option<String>,
    pub display_name: Option<String>,
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    pub provider_id: Option<String>,
    #[schema(pattern = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$", max_length = 200)]
    pub model: Option<String>,
    #[schema(schema_with = nullable_api_schema)]
    pub api: Option<String>,
    #[schema(schema_with = nullable_base_url_schema)]
    pub base_url: Option<String>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(schema_with = nullable_secret_ref)]
    pub api_key_ref: Option<Option<String>>,
    #[schema(schema_with = nullable_headers_schema)]
    pub headers: Option<BTreeMap<String, String>>,
    #[schema(schema_with = nullable_secret_headers_schema)]
    pub secret_header_refs: Option<BTreeMap<String, String>>,
    pub capabilities: Option<Vec<String>>,
    #[schema(schema_with = nullable_inputs_schema)]
    pub input: Option<Vec<String>>,
    #[schema(value_type = Option<JsonObject>)]
    pub compat: Option<serde_json::Map<String, serde_json::Value>>,
    pub enabled: Option<bool>,
}

/// Tells an explicit `null` (Some(None)) from an absent field (None).
fn present<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(deserializer).map(Some)
}

/// The wire protocols a preset may speak.
const APIS: [&str; 4] = [
    "media-job",
    "openai-completions",
    "openai-responses",
    "anthropic-messages",
];

fn api_schema() -> ObjectBuilder {
    one_of_strings(false, &APIS).description(Some("The wire protocol the preset speaks."))
}

fn base_url(nullable: bool) -> ObjectBuilder {
    string(nullable, HTTP_BASE_URL, None)
        .description(Some(
            "An http or https URL without credentials, query or fragment (IPv6 hosts are not \
             stated); a media preset's host must be its vendor's documented one or in \
             KEEL_PROVIDER_HOSTS (422 otherwise).",
        ))
        .examples(["https://ark.ap-southeast.bytepluses.com/api/v3"])
}

fn base_url_schema() -> ObjectBuilder {
    base_url(false)
}

fn nullable_base_url_schema() -> ObjectBuilder {
    base_url(true)
}

fn inputs(nullable: bool) -> ArrayBuilder {
    let kind = if nullable {
        SchemaType::from_iter([Type::Array, Type::Null])
    } else {
        SchemaType::new(Type::Array)
    };
    ArrayBuilder::new()
        .schema_type(kind)
        .items(one_of_strings(false, &PROVIDER_INPUTS))
        .description(Some("What the preset takes: `text`, `image`, `video`."))
}

fn inputs_schema() -> ArrayBuilder {
    inputs(false)
}

fn nullable_inputs_schema() -> ArrayBuilder {
    inputs(true)
}

fn nullable_secret_ref() -> ObjectBuilder {
    secret_ref(true).description(Some(
        "`env:NAME`, `file:/absolute/path` or `keychain:NAME`, allowed by the operator's \
         secret policy (422 otherwise).",
    ))
}

fn headers(nullable: bool) -> ObjectBuilder {
    string_map(
        nullable,
        PROVIDER_HEADER_NAME,
        string(false, NO_CONTROL, None),
        None,
    )
    .description(Some(
        "Header name (letters, digits, `-` and `_`) → value without control characters; \
         a credential header (`Authorization`, `X-Api-Key`, `Cookie`, …) belongs in \
         `secret_header_refs` (422).",
    ))
}

fn headers_schema() -> ObjectBuilder {
    headers(false)
}

fn nullable_headers_schema() -> ObjectBuilder {
    headers(true)
}

fn secret_headers(nullable: bool) -> ObjectBuilder {
    string_map(nullable, PROVIDER_HEADER_NAME, secret_ref(false), None).description(Some(
        "Header name (letters, digits, `-` and `_`) → secret reference (`env:NAME`, \
         `file:/absolute/path` or `keychain:NAME`), allowed by the operator's secret policy \
         (422 otherwise).",
    ))
}

fn secret_headers_schema() -> ObjectBuilder {
    secret_headers(false)
}

fn nullable_secret_headers_schema() -> ObjectBuilder {
    secret_headers(true)
}

fn nullable_api_schema() -> ObjectBuilder {
    one_of_strings(true, &APIS).description(Some("The wire protocol the preset speaks."))
}

/// The outcome of a provider check.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProviderCheck {
    pub ok: bool,
    /// `ready`, `provider_disabled`, `secret_missing`, `secret_store_unavailable`,
    /// `secret_not_allowed`, `unsupported_capability`, `provider_host_not_allowed`,
    /// `model_not_configured` or (a live check whose call failed) `live_call_failed`.
    pub code: String,
    /// Of a failed live call: the provider's error, with the preset's secrets redacted.
    pub message: String,
    /// Whether a live call was made (`?live=true` on a chat preset that is ready).
    pub live: bool,
    pub checked_at: DateTime<Utc>,
}

/// Whether a reference resolves, as `GET /v1/secrets/status` and provider views report it:
/// never the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SecretStatus {
    /// The reference as given.
    #[schema(example = "env:OPENAI_API_KEY")]
    pub r#ref: String,
    /// `env`, `file` or `keychain`.
    pub kind: String,
    pub configured: bool,
    /// Why it is not configured: `secret_missing`, `secret_store_unavailable` or
    /// `secret_not_allowed` (a stored preset the secret policy now refuses).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
