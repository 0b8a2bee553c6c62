//! Provider presets, their templates and checks, and secret status (seed 000, "Provider
//! Presets" and "Secrets"). Responses report whether a secret reference resolves in this
//! process, never its value.

use std::borrow::Cow;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::Utc;
use keel_api_types::{
    ProviderCheck, ProviderDraft, ProviderPatch, ProviderTemplate, ProviderView, SecretPurpose,
};
use keel_workers::agent::provider::{ChatClient, ChatLimits};
use keel_workers::agent::{Message, ProviderError};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{ApiJson, ApiQuery};
use crate::api::{
    ApiError, AppState, ListEnvelope, ObjectEnvelope, PageQuery, list, object, page_limit,
};
use crate::domain::{Caller, Invalid};
use crate::media::Vendor;
use crate::providers;
use crate::providers::ProviderRecord;
use crate::providers::chat::{CHAT_APIS, chat_api, chat_config};
use crate::providers::secrets::{SecretPolicy, SecretRef, SecretStatus};
use crate::providers::{Api, ProviderFields, ProviderHosts};

type Result<T> = std::result::Result<T, ApiError>;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_templates))
        .routes(routes!(list_providers, create_provider))
        .routes(routes!(get_provider, patch_provider, delete_provider))
        .routes(routes!(check_provider))
        .routes(routes!(secret_status))
}

/// A preset as the API shows it. Blocking: telling whether `api_key_ref` resolves may read
/// a file.
fn render(p: ProviderRecord, secrets: &SecretPolicy) -> ProviderView {
    let api_key_status = p.api_key().map(|r| r.status(secrets));
    ProviderView {
        api_key_configured: api_key_status.as_ref().is_some_and(|s| s.configured),
        api_key_status,
        id: p.id,
        kind: p.kind,
        display_name: p.display_name,
        provider_id: p.provider_id,
        model: p.model,
        api: p.api,
        base_url: p.base_url,
        api_key_ref: p.api_key_ref,
        headers: p.headers.0,
        secret_header_refs: p.secret_header_refs.0,
        capabilities: p.capabilities,
        input: p.input,
        compat: p.compat.0,
        enabled: p.enabled,
        last_check: p.last_check.map(|c| c.0),
        created_at: p.created_at,
        updated_at: p.updated_at,
    }
}

impl From<ProviderDraft> for ProviderFields {
    fn from(d: ProviderDraft) -> Self {
        ProviderFields {
            kind: d.kind,
            display_name: d.display_name,
            provider_id: d.provider_id,
            model: d.model,
            api: d.api,
            base_url: d.base_url,
            api_key_ref: d.api_key_ref,
            headers: d.headers,
            secret_header_refs: d.secret_header_refs,
            capabilities: d.capabilities,
            input: d.input,
            compat: d.compat,
            enabled: d.enabled,
        }
    }
}

/// The preset's fields with a patch applied.
fn patched(patch: ProviderPatch, mut f: ProviderFields) -> ProviderFields {
    f.kind = patch.kind.unwrap_or(f.kind);
    f.display_name = patch.display_name.or(f.display_name);
    f.provider_id = patch.provider_id.or(f.provider_id);
    f.model = patch.model.unwrap_or(f.model);
    f.api = patch.api.unwrap_or(f.api);
    f.base_url = patch.base_url.unwrap_or(f.base_url);
    f.api_key_ref = patch.api_key_ref.unwrap_or(f.api_key_ref);
    f.headers = patch.headers.unwrap_or(f.headers);
    f.secret_header_refs = patch.secret_header_refs.unwrap_or(f.secret_header_refs);
    f.capabilities = patch.capabilities.unwrap_or(f.capabilities);
    f.input = patch.input.unwrap_or(f.input);
    f.compat = patch.compat.unwrap_or(f.compat);
    f.enabled = patch.enabled.unwrap_or(f.enabled);
    f
}

const BYTEPLUS_ARK: &str = "https://ark.ap-southeast.bytepluses.com/api/v3";

const TEMPLATES: [ProviderTemplate; 4] = [
    ProviderTemplate {
        template_id: Cow::Borrowed("openai-images"),
        kind: Cow::Borrowed("openai-images"),
        display_name: Cow::Borrowed("OpenAI Images"),
        description: Cow::Borrowed("OpenAI image generation (POST /images/generations)."),
        provider_id: Cow::Borrowed("openai"),
        model: Cow::Borrowed("gpt-image-1"),
        api: Cow::Borrowed("media-job"),
        base_url: Cow::Borrowed("https://api.openai.com/v1"),
        api_key_ref: Cow::Borrowed("env:OPENAI_API_KEY"),
        capabilities: Cow::Borrowed(&[Cow::Borrowed("image_generate")]),
        input: Cow::Borrowed(&[Cow::Borrowed("text")]),
        enabled: false,
    },
    ProviderTemplate {
        template_id: Cow::Borrowed("seedream"),
        kind: Cow::Borrowed("seedream"),
        display_name: Cow::Borrowed("Seedream"),
        description: Cow::Borrowed(
            "BytePlus ModelArk Seedream: image generation, and edits from an image URL.",
        ),
        provider_id: Cow::Borrowed("byteplus"),
        model: Cow::Borrowed("seedream-4-0-250828"),
        api: Cow::Borrowed("media-job"),
        base_url: Cow::Borrowed(BYTEPLUS_ARK),
        api_key_ref: Cow::Borrowed("env:ARK_API_KEY"),
        capabilities: Cow::Borrowed(&[
            Cow::Borrowed("image_generate"),
            Cow::Borrowed("image_edit"),
        ]),
        input: Cow::Borrowed(&[Cow::Borrowed("text"), Cow::Borrowed("image")]),
        enabled: false,
    },
    ProviderTemplate {
        template_id: Cow::Borrowed("seedance"),
        kind: Cow::Borrowed("seedance"),
        display_name: Cow::Borrowed("Seedance"),
        description: Cow::Borrowed(
            "BytePlus ModelArk Seedance: video generation as a polled task.",
        ),
        provider_id: Cow::Borrowed("byteplus"),
        model: Cow::Borrowed("seedance-1-0-pro-250528"),
        api: Cow::Borrowed("media-job"),
        base_url: Cow::Borrowed(BYTEPLUS_ARK),
        api_key_ref: Cow::Borrowed("env:ARK_API_KEY"),
        capabilities: Cow::Borrowed(&[Cow::Borrowed("video_generate")]),
        input: Cow::Borrowed(&[Cow::Borrowed("text"), Cow::Borrowed("image")]),
        enabled: false,
    },
    ProviderTemplate {
        template_id: Cow::Borrowed("local-openai-compatible-relay"),
        kind: Cow::Borrowed("openai-compatible"),
        display_name: Cow::Borrowed("Local OpenAI-Compatible Relay"),
        description: Cow::Borrowed(
            "Local relay, LiteLLM, OpenRouter-style or private compatible gateways.",
        ),
        provider_id: Cow::Borrowed("local-relay"),
        model: Cow::Borrowed("dpv4"),
        api: Cow::Borrowed("openai-completions"),
        base_url: Cow::Borrowed("http://127.0.0.1:8317/v1"),
        api_key_ref: Cow::Borrowed("env:LOCAL_RELAY_API_KEY"),
        capabilities: Cow::Borrowed(&[
            Cow::Borrowed("chat"),
            Cow::Borrowed("tool_call"),
            Cow::Borrowed("reasoning"),
        ]),
        input: Cow::Borrowed(&[Cow::Borrowed("text")]),
        enabled: false,
    },
];

/// Provider templates: request bodies for `POST /providers`, disabled by default.
#[utoipa::path(get, path = "/provider-templates", tag = "providers",
    responses((status = 200, description = "The templates", body = ListEnvelope<ProviderTemplate>)))]
async fn list_templates() -> Json<ListEnvelope<&'static ProviderTemplate>> {
    Json(list(
        TEMPLATES.iter().collect(),
        TEMPLATES.len() as i64,
        |t| t.template_id.to_string(),
    ))
}

/// Lists provider presets.
#[utoipa::path(get, path = "/providers", tag = "providers", params(PageQuery),
    responses((status = 200, description = "A page of presets", body = ListEnvelope<ProviderView>)))]
async fn list_providers(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<ListEnvelope<ProviderView>>> {
    let limit = page_limit(page.limit)?;
    let mut conn = state.pool.acquire().await?;
    let cursor = page.cursor.as_deref();
    let rows = providers::list(&mut conn, &caller.scope, cursor, limit + 1).await?;
    let page = list(rows, limit, |p| p.id.clone());
    let views = off_runtime(&state, move |s| page.map(|p| render(p, s))).await?;
    Ok(Json(views))
}

/// Runs `f` with the secret policy on a blocking thread: resolving a reference may read a
/// file, which must not stall the async runtime's workers.
async fn off_runtime<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce(&SecretPolicy) -> T + Send + 'static,
) -> Result<T> {
    let secrets = state.secrets.clone();
    tokio::task::spawn_blocking(move || f(&secrets))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))
}

async fn view(state: &AppState, provider: ProviderRecord) -> Result<ProviderView> {
    off_runtime(state, move |s| render(provider, s)).await
}

/// Creates a provider preset.
#[utoipa::path(post, path = "/providers", tag = "providers", request_body = ProviderDraft,
    responses((status = 201, description = "The new preset", body = ObjectEnvelope<ProviderView>)))]
async fn create_provider(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(draft): ApiJson<ProviderDraft>,
) -> Result<(StatusCode, Json<ObjectEnvelope<ProviderView>>)> {
    let spec =
        ProviderFields::from(draft).validate(&state.secrets, &state.provider_hosts, &caller)?;
    let mut conn = state.pool.acquire().await?;
    let provider = providers::create(&mut conn, &caller.scope, &spec).await?;
    let view = view(&state, provider).await?;
    Ok((StatusCode::CREATED, Json(object("provider", view))))
}

/// Reads a provider preset.
#[utoipa::path(get, path = "/providers/{id}", tag = "providers",
    params(("id" = String, Path, description = "The preset's id (`provider_…`)")),
    responses((status = 200, description = "The preset", body = ObjectEnvelope<ProviderView>)))]
async fn get_provider(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ObjectEnvelope<ProviderView>>> {
    let mut conn = state.pool.acquire().await?;
    let provider = providers::get(&mut conn, &caller.scope, &id).await?;
    Ok(Json(object("provider", view(&state, provider).await?)))
}

/// Changes a provider preset, which becomes the caller's; the last check is cleared. A
/// preset an operator wrote is an operator's to change (403 for a member), and one the
/// runtime operator wrote the runtime operator's.
#[utoipa::path(patch, path = "/providers/{id}", tag = "providers",
    params(("id" = String, Path, description = "The preset's id (`provider_…`)")), request_body = ProviderPatch,
    responses((status = 200, description = "The preset", body = ObjectEnvelope<ProviderView>),
              (status = 403, description = "Written by a role above the caller's")))]
async fn patch_provider(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(patch): ApiJson<ProviderPatch>,
) -> Result<Json<ObjectEnvelope<ProviderView>>> {
    let mut tx = state.pool.begin().await?;
    let scope = &caller.scope;
    let current = providers::lock(&mut tx, scope, &id, providers::LockMode::Update).await?;
    current.check_writer(caller.role, "change")?;
    // The whole preset as changed, as this caller writes it.
    let spec = patched(patch, current.fields()).validate(
        &state.secrets,
        &state.provider_hosts,
        &caller,
    )?;
    let provider = providers::update(&mut tx, scope, &id, &spec).await?;
    tx.commit().await?;
    Ok(Json(object("provider", view(&state, provider).await?)))
}

/// Deletes a provider preset that no media job names; a preset an operator wrote is an
/// operator's to delete (403 for a member), and one the runtime operator wrote the runtime
/// operator's.
#[utoipa::path(delete, path = "/providers/{id}", tag = "providers",
    params(("id" = String, Path, description = "The preset's id (`provider_…`)")),
    responses((status = 204, description = "Deleted"),
              (status = 403, description = "Written by a role above the caller's")))]
async fn delete_provider(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    let mut tx = state.pool.begin().await?;
    providers::delete(&mut tx, &caller.scope, &id, caller.role).await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct CheckQuery {
    /// Also make one tiny live call, on chat presets only (400 on a media preset): one
    /// user message "ping", `max_tokens` 1, no tools, 10 s at most. The provider bills it.
    #[serde(default)]
    live: bool,
}

/// Longest a live check waits for the provider, connecting and streaming included.
const LIVE_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks a preset's readiness in this process: enabled, secrets resolvable, capabilities
/// runnable. Static unless `live=true`, which also calls a chat preset's model once; a
/// media preset cannot be checked live (a call would generate, and bill, media).
#[utoipa::path(post, path = "/providers/{id}/check", tag = "providers",
    params(("id" = String, Path, description = "The preset's id (`provider_…`)"), CheckQuery),
    responses((status = 200, description = "The check", body = ObjectEnvelope<ProviderCheck>),
        (status = 400, description = "`live=true` on a preset that is not a chat preset")))]
async fn check_provider(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<CheckQuery>,
) -> Result<Json<ObjectEnvelope<ProviderCheck>>> {
    let mut conn = state.pool.acquire().await?;
    let provider = providers::get(&mut conn, &caller.scope, &id).await?;
    if query.live && chat_api(&provider.api).is_none() {
        return Err(ApiError::invalid(format!(
            "live checks are for chat presets ({CHAT_APIS}); {} speaks {}",
            provider.id, provider.api
        )));
    }
    let hosts = state.provider_hosts.clone();
    let static_check = provider.clone();
    let (mut code, mut message) =
        off_runtime(&state, move |s| readiness(&static_check, s, &hosts)).await?;
    let live = query.live && code == "ready";
    if live {
        (code, message) = live_call(&state, provider).await?;
    }
    let check = ProviderCheck {
        ok: code == "ready",
        code: code.to_string(),
        message,
        live,
        checked_at: Utc::now(),
    };
    let stored = serde_json::to_value(&check).map_err(|e| ApiError::Internal(e.to_string()))?;
    providers::record_check(&mut conn, &caller.scope, &id, &stored).await?;
    Ok(Json(object("provider_check", check)))
}

/// One "ping" to the preset's model, answered in at most one token.
async fn live_call(state: &AppState, provider: ProviderRecord) -> Result<(&'static str, String)> {
    let limits = ChatLimits {
        request_timeout: LIVE_CHECK_TIMEOUT,
        ..state.chat
    };
    let hosts = state.provider_hosts.clone();
    let resolved = off_runtime(state, move |s| {
        chat_config(&provider, None, s, &hosts, &limits)
    })
    .await?;
    let mut config = match resolved {
        Ok(config) => config,
        Err(unresolved) => return Ok((unresolved.code.as_str(), unresolved.message)),
    };
    config.max_tokens = Some(1);
    let failed = |error: ProviderError| Ok(("live_call_failed", error.to_string()));
    let client = match ChatClient::new(config) {
        Ok(client) => client,
        Err(error) => return failed(error),
    };
    let ping = [Message::User {
        content: "ping".into(),
    }];
    let mut ignore_text = |_: &str| {};
    let call = client.complete(&ping, &[], &mut ignore_text);
    match tokio::time::timeout(LIVE_CHECK_TIMEOUT, call).await {
        Ok(Ok(response)) => Ok((
            "ready",
            format!(
                "The preset is enabled, its secrets resolve in this process, and {} answered \
                 a live call.",
                response.model
            ),
        )),
        Ok(Err(error)) => failed(error),
        Err(_) => Ok((
            "live_call_failed",
            format!("the provider did not answer within {LIVE_CHECK_TIMEOUT:?}"),
        )),
    }
}

/// Blocking: resolving the references may read files.
fn readiness(
    provider: &ProviderRecord,
    secrets: &SecretPolicy,
    hosts: &ProviderHosts,
) -> (&'static str, String) {
    if !provider.enabled {
        return (
            "provider_disabled",
            format!("provider {} is disabled", provider.id),
        );
    }
    if provider.api() == Api::MediaJob && provider.capabilities.is_empty() {
        return (
            "unsupported_capability",
            "a media-job preset must list at least one operation in capabilities".into(),
        );
    }
    // A preset stored before the host list narrowed; the worker would refuse it too.
    let vendor = Vendor::parse(&provider.kind).filter(|_| provider.api() == Api::MediaJob);
    if let Some(Err(message)) = vendor.map(|v| hosts.check(v, &provider.base_url)) {
        return ("provider_host_not_allowed", message);
    }
    // A tenant's preset whose grants or chat host were withdrawn since it was written.
    if let Err(unresolved) = provider.check_use(secrets, hosts) {
        return (unresolved.code.as_str(), unresolved.message);
    }
    // A chat model served locally may need no key; a media vendor always does.
    let key = provider.api_key();
    if key.is_none() && chat_api(&provider.api).is_none() {
        return ("secret_missing", "the preset names no api_key_ref".into());
    }
    let refs = key
        .into_iter()
        .chain(provider.secret_headers().into_iter().map(|(_, r)| r));
    for secret in refs {
        if let Err(unresolved) = secret.resolve(secrets) {
            return (unresolved.code.as_str(), unresolved.message);
        }
    }
    (
        "ready",
        "The preset is enabled and its secrets resolve in this process.".into(),
    )
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct SecretQuery {
    /// The reference: `env:NAME`, `file:/absolute/path` or `keychain:NAME`. Only
    /// references the secret policy allows are looked at (422 for others), and for a
    /// tenant only those granted to its workspace.
    #[param(
        pattern = "^(env:[A-Za-z_][A-Za-z0-9_]*|file:/[^\\u0000]*|keychain:[^\\u0000]{1,200})$"
    )]
    r#ref: String,
    /// What the secret is for.
    #[param(value_type = Option<SecretPurpose>, inline)]
    purpose: Option<String>,
}

/// Whether a secret reference resolves in this process; never its value. Only references
/// the secret policy allows are looked at (422 for others), and for a tenant (a member or
/// the org's operator) only those its workspace was granted, so the route cannot tell a
/// tenant whether an arbitrary file or the deployment's variables exist.
#[utoipa::path(get, path = "/secrets/status", tag = "providers", params(SecretQuery),
    responses((status = 200, description = "The status", body = ObjectEnvelope<SecretStatus>)))]
async fn secret_status(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<SecretQuery>,
) -> Result<Json<ObjectEnvelope<SecretStatus>>> {
    let known = |p: &&str| SecretPurpose::parse(p).is_some();
    if let Some(purpose) = query.purpose.as_deref().filter(|p| !known(p)) {
        return Err(ApiError::invalid(format!(
            "unknown purpose {purpose:?}; expected {}",
            SecretPurpose::names()
        )));
    }
    let secret = SecretRef::parse(&query.r#ref)
        .map_err(|message| ApiError::invalid(format!("ref {message}")))?;
    state
        .secrets
        .check_for(caller.role, caller.scope.workspace(), &secret)
        .map_err(|message| Invalid::new("ref", message))?;
    let status = off_runtime(&state, move |s| secret.status(s)).await?;
    Ok(Json(object("secret_status", status)))
}
