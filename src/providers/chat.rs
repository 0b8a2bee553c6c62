//! A chat preset resolved for calls: what an agent run's worker and the API's live check
//! hand to [`ChatClient`](keel_workers::agent::provider::ChatClient). Secrets are resolved
//! here, at each call site, under the process's current policy, like media jobs' presets.

use keel_api_types::ErrorCode;
use keel_workers::agent::provider::{ChatApi, ChatLimits, ProviderConfig};

use crate::providers::ProviderRecord;
use crate::providers::secrets::{SecretPolicy, Unresolved};
use crate::providers::{Api, ProviderHosts};

/// The call settings of `preset` with `model` (the task's `requested_model`) overriding the
/// preset's. Blocking: resolving a `file:` reference reads the file.
///
/// Unresolved codes: `provider_disabled`, `invalid_request` (not a chat preset: only
/// the [`CHAT_APIS`] are), `model_not_configured`, and the
/// secrets' own (`secret_missing`, `secret_not_allowed`, …). A preset without an
/// `api_key_ref` calls without a key (a model served locally). A tenant's preset whose
/// secrets are no longer granted or whose host is no longer allowed is
/// `secret_not_granted` or `provider_host_not_allowed`, before any secret resolves.
pub(crate) fn chat_config(
    preset: &ProviderRecord,
    model: Option<&str>,
    secrets: &SecretPolicy,
    hosts: &ProviderHosts,
    limits: &ChatLimits,
) -> Result<ProviderConfig, Unresolved> {
    if !preset.enabled {
        return Err(Unresolved {
            code: ErrorCode::ProviderDisabled,
            message: format!("provider {} is disabled", preset.id),
        });
    }
    let api = chat_api(&preset.api).ok_or_else(|| Unresolved {
        code: ErrorCode::InvalidRequest,
        message: format!(
            "provider {} speaks {}, not a chat api ({CHAT_APIS})",
            preset.id, preset.api
        ),
    })?;
    let model = model
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .unwrap_or(preset.model.trim());
    if model.is_empty() {
        return Err(Unresolved {
            code: ErrorCode::ModelNotConfigured,
            message: format!("provider {} names no model and the task none", preset.id),
        });
    }
    preset.check_use(secrets, hosts)?;
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
        reasoning_effort: None,
        allow_private_addresses: limits.allow_private_addresses,
    })
}

/// The preset `api`s a model call can speak, for messages.
pub(crate) const CHAT_APIS: &str = "openai-completions, openai-responses or anthropic-messages";

/// The chat protocol of a preset's `api`, if it is one a model call can speak.
pub(crate) fn chat_api(api: &str) -> Option<ChatApi> {
    match Api::parse(api)? {
        Api::OpenAiCompletions => Some(ChatApi::OpenAiCompletions),
        Api::OpenAiResponses => Some(ChatApi::OpenAiResponses),
        Api::AnthropicMessages => Some(ChatApi::AnthropicMessages),
        Api::MediaJob => None,
    }
}

/// `compat.max_tokens`, when the preset sets a positive whole number.
fn max_tokens(preset: &ProviderRecord) -> Option<u32> {
    let value = preset.compat.0.get("max_tokens")?.as_u64()?;
    u32::try_from(value).ok().filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::time::Duration;

    use sqlx::types::Json;

    use super::*;

    fn preset(api: &str, key_ref: Option<String>) -> ProviderRecord {
        ProviderRecord {
            id: "provider_1".into(),
            kind: "local-llm".into(),
            display_name: "Local".into(),
            provider_id: "local-llm".into(),
            model: "qwen-coder".into(),
            api: api.into(),
            base_url: "http://llm.internal:8000/v1".into(),
            api_key_ref: key_ref,
            headers: Json(BTreeMap::from([("x-team".into(), "keel".into())])),
            secret_header_refs: Json(BTreeMap::new()),
            capabilities: vec!["chat".into(), "tool_call".into()],
            input: vec!["text".into()],
            compat: Json(serde_json::Map::new()),
            enabled: true,
            last_check: None,
            created_at: chrono::Utc::now(),
            updated_at: chrono::Utc::now(),
            workspace_id: "default".into(),
            written_by_role: "runtime_operator".into(),
        }
    }

    const LIMITS: ChatLimits = ChatLimits {
        request_timeout: Duration::from_secs(42),
        allow_private_addresses: true,
    };

    #[test]
    fn a_chat_preset_resolves_with_its_secret_and_the_tasks_model() {
        let dir = tempfile::tempdir().unwrap();
        let path: PathBuf = dir.path().join("key");
        std::fs::write(&path, "sk-from-a-file\n").unwrap();
        let secrets = SecretPolicy::new(vec![], vec![dir.path().to_path_buf()]);
        let mut record = preset(
            "anthropic-messages",
            Some(format!("file:{}", path.display())),
        );
        record
            .compat
            .0
            .insert("max_tokens".into(), serde_json::json!(2048));

        let config = chat_config(
            &record,
            Some(" claude-x "),
            &secrets,
            &ProviderHosts::default(),
            &LIMITS,
        )
        .unwrap();
        assert_eq!(config.api, ChatApi::AnthropicMessages);
        assert_eq!(config.provider, "provider_1");
        assert_eq!(config.model, "claude-x");
        assert_eq!(
            config.api_key.as_ref().map(|k| k.expose()),
            Some("sk-from-a-file")
        );
        assert_eq!(config.headers, [("x-team".to_string(), "keel".to_string())]);
        assert_eq!(config.max_tokens, Some(2048));
        assert_eq!(config.request_timeout, Duration::from_secs(42));
        assert!(config.allow_private_addresses);

        let preset_model = chat_config(
            &record,
            Some(""),
            &secrets,
            &ProviderHosts::default(),
            &LIMITS,
        )
        .unwrap();
        assert_eq!(preset_model.model, "qwen-coder");
    }

    #[test]
    fn presets_that_cannot_chat_are_unresolved_with_a_code() {
        let secrets = SecretPolicy::default();
        let code = |record: &ProviderRecord| {
            chat_config(record, None, &secrets, &ProviderHosts::default(), &LIMITS)
                .err()
                .map(|u| u.code.as_str())
        };
        let keyless = preset("openai-completions", None);
        assert_eq!(code(&keyless), None, "a local model needs no key");
        assert_eq!(code(&preset("media-job", None)), Some("invalid_request"));
        assert_eq!(
            code(&preset("openai-responses", None)),
            None,
            "the Responses API chats too"
        );
        let mut no_model = preset("openai-completions", None);
        no_model.model = " ".into();
        assert_eq!(code(&no_model), Some("model_not_configured"));
        let mut disabled = preset("openai-completions", None);
        disabled.enabled = false;
        assert_eq!(code(&disabled), Some("provider_disabled"));
        let missing = preset(
            "openai-completions",
            Some("env:NOT_SET_ANYWHERE_API_KEY".into()),
        );
        assert_eq!(code(&missing), Some("secret_missing"));
    }

    #[test]
    fn a_tenants_preset_is_checked_again_at_use() {
        let granted = SecretPolicy::new(vec!["ORG_A_*".into()], vec![])
            .with_grants(&["org_a=env:ORG_A_KEY".into()])
            .unwrap();
        let listed = ProviderHosts::new(["llm.internal:8000".to_string()]);
        let mut member = preset("openai-completions", Some("env:ORG_A_KEY".into()));
        member.workspace_id = "org_a".into();
        member.written_by_role = "member".into();
        member.base_url = "https://llm.internal:8000/v1".into();
        let code = |record: &ProviderRecord, secrets: &SecretPolicy, hosts: &ProviderHosts| {
            chat_config(record, None, secrets, hosts, &LIMITS)
                .err()
                .map(|u| u.code.as_str())
        };
        // Granted and listed: it resolves on to its (unset) secret.
        assert_eq!(code(&member, &granted, &listed), Some("secret_missing"));
        // The grant withdrawn, the host delisted: refused before anything resolves.
        let withdrawn = SecretPolicy::new(vec!["ORG_A_*".into()], vec![]);
        assert_eq!(
            code(&member, &withdrawn, &listed),
            Some("secret_not_granted")
        );
        assert_eq!(
            code(&member, &granted, &ProviderHosts::default()),
            Some("provider_host_not_allowed")
        );
        let mut header = member.clone();
        header.secret_header_refs =
            Json(BTreeMap::from([("x-k".into(), "env:ORG_A_OTHER".into())]));
        assert_eq!(code(&header, &granted, &listed), Some("secret_not_granted"));
        // An org operator's preset is a tenant's too.
        member.written_by_role = "operator".into();
        assert_eq!(
            code(&member, &withdrawn, &listed),
            Some("secret_not_granted")
        );
        // The runtime operator's names the deployment's secrets and any host.
        member.written_by_role = "runtime_operator".into();
        assert_eq!(
            code(&member, &withdrawn, &ProviderHosts::default()),
            Some("secret_missing")
        );
    }
}
