//! Provider presets: reusable, non-secret provider configuration, named secrets by
//! reference only, and what checking a preset or a reference tells.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa::openapi::schema::ObjectBuilder;

use crate::schema::{JsonObject, one_of_strings};

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
    /// An http or https URL without a fragment; a media preset's host must be its vendor's
    /// documented one or in KEEL_PROVIDER_HOSTS (422 otherwise).
    #[schema(example = "https://ark.ap-southeast.bytepluses.com/api/v3")]
    pub base_url: String,
    /// `env:NAME`, `file:/absolute/path` or `keychain:NAME`, allowed by the operator's
    /// secret policy (422 otherwise).
    #[schema(example = "env:ARK_API_KEY")]
    pub api_key_ref: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Header name → secret reference.
    #[serde(default)]
    pub secret_header_refs: BTreeMap<String, String>,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
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
    pub base_url: Option<String>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub api_key_ref: Option<Option<String>>,
    pub headers: Option<BTreeMap<String, String>>,
    pub secret_header_refs: Option<BTreeMap<String, String>>,
    pub capabilities: Option<Vec<String>>,
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
