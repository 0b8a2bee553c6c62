//! A chat preset resolved for calls: what an agent run's worker and the API's live check
//! hand to [`ChatClient`](keel_workers::agent::provider::ChatClient). Secrets are resolved
//! here, at each call site, under the process's current policy, like media jobs' presets.

use keel_workers::agent::provider::{ChatApi, ChatLimits, ProviderConfig};

use crate::domain::provider::Api;
use crate::domain::secret::{SecretPolicy, Unresolved};
use crate::store::providers::ProviderRecord;

/// The call settings of `preset` with `model` (the task's `requested_model`) overriding the
/// preset's. Blocking: resolving a `file:` reference reads the file.
///
/// Unresolved codes: `provider_disabled`, `invalid_request` (not a chat preset: only
/// `openai-completions` and `anthropic-messages` are), `model_not_configured`, and the
/// secrets' own (`secret_missing`, `secret_not_allowed`, …). A preset without an
/// `api_key_ref` calls without a key (a model served locally).
pub fn chat_config(
    preset: &ProviderRecord,
    model: Option<&str>,
    secrets: &SecretPolicy,
    limits: &ChatLimits,
) -> Result<ProviderConfig, Unresolved> {
    if !preset.enabled {
        return Err(Unresolved {
            code: "provider_disabled",
            message: format!("provider {} is disabled", preset.id),
        });
    }
    let api = chat_api(&preset.api).ok_or_else(|| Unresolved {
        code: "invalid_request",
        message: format!(
            "provider {} speaks {}, not a chat api (openai-completions or anthropic-messages)",
            preset.id, preset.api
        ),
    })?;
    let model = model
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .unwrap_or(preset.model.trim());
    if model.is_empty() {
        return Err(Unresolved {
            code: "model_not_configured",
            message: format!("provider {} names no model and the task none", preset.id),
        });
    }
    let api_key = preset
        .api_key()
        .map(|key| key.resolve(secrets))
        .transpose()?;
    let secret_headers = preset
        .secret_headers()
        .into_iter()
        .map(|(name, secret)| Ok((name, secret.resolve(secrets)?)))
        .collect::<Result<_, Unresolved>>()?;
    Ok(ProviderConfig {
        api,
        provider: preset.id.clone(),
        base_url: preset.base_url.clone(),
        model: model.to_string(),
        api_key,
        headers: preset.headers.0.clone().into_iter().collect(),
        secret_headers,
        request_timeout: limits.request_timeout,
        max_tokens: max_tokens(preset),
        allow_private_addresses: limits.allow_private_addresses,
    })
}

/// The chat protocol of a preset's `api`, if it is one a model call can speak.
pub fn chat_api(api: &str) -> Option<ChatApi> {
    match Api::parse(api)? {
        Api::OpenAiCompletions => Some(ChatApi::OpenAiCompletions),
        Api::AnthropicMessages => Some(ChatApi::AnthropicMessages),
        Api::MediaJob | Api::OpenAiResponses => None,
    }
}

/// `compat.max_tokens`, when the preset sets a positive whole number.
fn max_tokens(preset: &ProviderRecord) -> Option<u32> {
    let value = preset.compat.0.get("max_tokens")?.as_u64()?;
    u32::try_from(value).ok().filter(|&n| n > 0)
}
