//! Provider presets: reusable, non-secret provider configuration (seed 000, "Provider
//! Presets"). A preset names its API key and secret headers by reference only.

use keel_api_types::ErrorCode;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::{Caller, Invalid, Role};
use crate::providers::secrets::{SecretPolicy, SecretRef, Unresolved};
use keel_workers::media::{Operation, Vendor};

/// The wire protocol a preset speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) enum Api {
    #[serde(rename = "media-job")]
    MediaJob,
    #[serde(rename = "openai-completions")]
    OpenAiCompletions,
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    #[serde(rename = "anthropic-messages")]
    AnthropicMessages,
}

impl Api {
    const ALL: [Api; 4] = [
        Api::MediaJob,
        Api::OpenAiCompletions,
        Api::OpenAiResponses,
        Api::AnthropicMessages,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Api::MediaJob => "media-job",
            Api::OpenAiCompletions => "openai-completions",
            Api::OpenAiResponses => "openai-responses",
            Api::AnthropicMessages => "anthropic-messages",
        }
    }

    pub(crate) fn parse(value: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|a| a.as_str() == value)
    }
}

const CHAT_CAPABILITIES: [&str; 3] = ["chat", "tool_call", "reasoning"];
const INPUTS: [&str; 3] = keel_api_types::PROVIDER_INPUTS;
/// Headers that carry credentials: they belong in `secret_header_refs`, never in `headers`.
const CREDENTIAL_HEADERS: [&str; 6] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "cookie",
    "x-goog-api-key",
];

/// A preset's fields, validated; what the store writes on create and after a patch.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSpec {
    pub(crate) kind: String,
    pub(crate) display_name: String,
    pub(crate) provider_id: String,
    pub(crate) model: String,
    pub(crate) api: Api,
    pub(crate) base_url: String,
    pub(crate) api_key_ref: Option<SecretRef>,
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) secret_header_refs: BTreeMap<String, SecretRef>,
    pub(crate) capabilities: Vec<String>,
    pub(crate) input: Vec<String>,
    pub(crate) compat: serde_json::Map<String, serde_json::Value>,
    pub(crate) enabled: bool,
    /// The writer's role: a tenant's preset is checked again at each use
    /// ([`check_tenants_use`]).
    pub(crate) written_by: Role,
}

/// The fields of a preset as a request names them, before validation.
#[derive(Debug, Clone, Default)]
pub struct ProviderFields {
    pub kind: String,
    pub display_name: Option<String>,
    pub provider_id: Option<String>,
    pub model: String,
    pub api: String,
    pub base_url: String,
    pub api_key_ref: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub secret_header_refs: BTreeMap<String, String>,
    pub capabilities: Vec<String>,
    pub input: Vec<String>,
    pub compat: serde_json::Map<String, serde_json::Value>,
    pub enabled: bool,
}

impl ProviderFields {
    /// Checks the fields as `writer` writes them; every secret reference must also be one
    /// `secrets` allows, and a media preset's host one `hosts` allows. A tenant's preset
    /// (a member's or an org operator's) may name only the secrets its workspace was
    /// granted, and a chat preset's host must be one `hosts` allows too: only the runtime
    /// operator's chat preset may aim at any host, since the deployment owns the secrets it
    /// sends.
    pub fn validate(
        self,
        secrets: &SecretPolicy,
        hosts: &ProviderHosts,
        writer: &Caller,
    ) -> Result<ProviderSpec, Invalid> {
        let tenant = !writer.role.is_runtime_operator();
        let workspace = writer.scope.workspace();
        let secret_ref = |value: &str| {
            let parsed = SecretRef::parse(value)?;
            secrets.check_for(writer.role, workspace, &parsed)?;
            Ok::<_, String>(parsed)
        };
        let kind = slug("kind", self.kind)?;
        let api = Api::parse(&self.api).ok_or_else(|| {
            Invalid::new(
                "api",
                format!(
                    "unknown api {:?}; expected media-job, openai-completions, openai-responses or anthropic-messages",
                    self.api
                ),
            )
        })?;
        let model = required("model", self.model)?;
        let base_url = base_url(self.base_url)?;
        let api_key_ref = self
            .api_key_ref
            .map(|r| secret_ref(&r).map_err(|m| Invalid::new("api_key_ref", m)))
            .transpose()?;
        check_headers(&self.headers)?;
        let secret_header_refs = self
            .secret_header_refs
            .into_iter()
            .map(|(name, r)| {
                let parsed = secret_ref(&r)
                    .map_err(|m| Invalid::new("secret_header_refs", format!("{name}: {m}")))?;
                Ok((header_name("secret_header_refs", name)?, parsed))
            })
            .collect::<Result<_, Invalid>>()?;
        check_capabilities(api, &kind, &self.capabilities)?;
        if let Some(vendor) = Vendor::parse(&kind).filter(|_| api == Api::MediaJob) {
            hosts
                .check(vendor, &base_url)
                .map_err(|m| Invalid::new("base_url", m))?;
        } else if tenant && api != Api::MediaJob {
            hosts
                .check_chat(&base_url)
                .map_err(|m| Invalid::new("base_url", m))?;
        }
        check_inputs(&self.input)?;
        crate::domain::check_free_json("compat", &serde_json::Value::Object(self.compat.clone()))?;
        let provider_id = match self.provider_id {
            Some(id) => slug("provider_id", id)?,
            None => kind.clone(),
        };
        Ok(ProviderSpec {
            display_name: self.display_name.unwrap_or_else(|| model.clone()),
            provider_id,
            kind,
            model,
            api,
            base_url,
            api_key_ref,
            headers: self.headers,
            secret_header_refs,
            capabilities: self.capabilities,
            input: self.input,
            compat: self.compat,
            enabled: self.enabled,
            written_by: writer.role,
        })
    }
}

/// Whether a tenant's preset (a member's or an org operator's) may still be used as
/// stored, under the settings of the process about to use it: every secret it names is
/// granted to its `workspace`, and a chat preset's host is one `hosts` allows. The grants
/// and the host list may have narrowed since the preset was written, and the tenant's check
/// then was the API's; the runtime operator's preset is not held to them (the deployment
/// owns the secrets it names). Nothing is read: a refused preset resolves no secret and
/// calls no host.
pub(crate) fn check_tenants_use<'a>(
    workspace: &str,
    api: Api,
    base_url: &str,
    secrets: impl IntoIterator<Item = &'a SecretRef>,
    policy: &SecretPolicy,
    hosts: &ProviderHosts,
) -> Result<(), Unresolved> {
    for secret in secrets {
        policy
            .check_granted(workspace, secret)
            .map_err(|message| Unresolved {
                code: ErrorCode::SecretNotGranted,
                message,
            })?;
    }
    if api == Api::MediaJob {
        // A media preset's host is checked for every writer before each call.
        return Ok(());
    }
    hosts.check_chat(base_url).map_err(|message| Unresolved {
        code: ErrorCode::ProviderHostNotAllowed,
        message,
    })
}

fn required(field: &'static str, value: String) -> Result<String, Invalid> {
    let trimmed = value.trim();
    if trimmed.is_empty() || trimmed.len() > 200 {
        return Err(Invalid::new(field, "must be 1 to 200 characters"));
    }
    Ok(trimmed.to_string())
}

fn slug(field: &'static str, value: String) -> Result<String, Invalid> {
    let ok = value.len() <= 64
        && value.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        return Err(Invalid::new(
            field,
            "must be 1 to 64 lowercase letters, digits or dashes, starting with a letter or digit",
        ));
    }
    Ok(value)
}

fn base_url(value: String) -> Result<String, Invalid> {
    let url = reqwest::Url::parse(value.trim())
        .map_err(|e| Invalid::new("base_url", format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(Invalid::new("base_url", "must be an http or https URL"));
    }
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
        return Err(Invalid::new(
            "base_url",
            "must carry no credentials or query; use api_key_ref and secret_header_refs",
        ));
    }
    // Request paths are appended to the base URL: after a fragment they would vanish.
    if url.fragment().is_some() {
        return Err(Invalid::new("base_url", "must carry no fragment (#...)"));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// Hosts each vendor documents for its API; a preset aimed elsewhere needs the operator's
/// consent, because the worker sends the preset's credentials there.
fn documented_hosts(vendor: Vendor) -> &'static [&'static str] {
    match vendor {
        Vendor::OpenAiImages => &["api.openai.com"],
        Vendor::Seedream | Vendor::Seedance => &[
            "ark.ap-southeast.bytepluses.com",
            "ark.cn-beijing.volces.com",
        ],
    }
}

/// The chat APIs' documented hosts, for a tenant's chat preset.
const CHAT_HOSTS: [&str; 2] = ["api.openai.com", "api.anthropic.com"];

/// A host the operator lists, with the one port it may be called on (any, when unset).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ListedHost {
    host: String,
    port: Option<u16>,
}

impl ListedHost {
    /// `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address.
    fn parse(entry: &str) -> ListedHost {
        let entry = entry.trim().to_ascii_lowercase();
        let (host, port) = match entry.strip_prefix('[') {
            Some(rest) => match rest.split_once(']') {
                Some((host, tail)) => (host.to_string(), tail.strip_prefix(':')),
                None => (rest.to_string(), None),
            },
            None => match entry.split_once(':') {
                Some((host, port)) if !port.contains(':') => (host.to_string(), Some(port)),
                _ => (entry.clone(), None),
            },
        };
        ListedHost {
            host,
            // A port that does not parse matches no URL's.
            port: port.map(|p| p.parse().unwrap_or(0)),
        }
    }
}

/// Which hosts a preset's `base_url` may name: the vendor's documented ones over https on
/// port 443, plus those the operator lists (`KEEL_PROVIDER_HOSTS`) on their port (any when
/// the entry names none), over https, or over http when the host is a loopback address.
/// Media presets are checked by the API when written and by the worker before each call,
/// since the list may have narrowed; tenants' chat presets when written and again at each
/// use ([`check_tenants_use`]).
#[derive(Debug, Clone, Default)]
pub struct ProviderHosts {
    extra: Vec<ListedHost>,
}

impl ProviderHosts {
    pub(crate) fn new(extra: impl IntoIterator<Item = String>) -> Self {
        let extra = extra
            .into_iter()
            .map(|entry| ListedHost::parse(&entry))
            .filter(|listed| !listed.host.is_empty())
            .collect();
        ProviderHosts { extra }
    }

    /// A media preset's host, for `vendor`.
    pub(crate) fn check(&self, vendor: Vendor, base_url: &str) -> Result<(), String> {
        self.check_url(vendor.as_str(), documented_hosts(vendor), base_url)
    }

    /// A tenant's chat preset's host.
    pub(crate) fn check_chat(&self, base_url: &str) -> Result<(), String> {
        self.check_url("a chat api", &CHAT_HOSTS, base_url)
    }

    /// A host only the list allows, for `who` (a tenant's MCP server): none is documented.
    pub(crate) fn check_listed(&self, who: &str, url: &str) -> Result<(), String> {
        self.check_url(who, &[], url)
    }

    fn check_url(&self, who: &str, documented: &[&str], base_url: &str) -> Result<(), String> {
        let url = reqwest::Url::parse(base_url).map_err(|e| format!("not a URL: {e}"))?;
        let host = url
            .host_str()
            .unwrap_or_default()
            .trim_matches(['[', ']'])
            .to_ascii_lowercase();
        let port = url.port_or_known_default();
        let https = url.scheme() == "https";
        let listed = self
            .extra
            .iter()
            .any(|l| l.host == host && l.port.is_none_or(|p| Some(p) == port));
        if listed && (https || is_loopback(&host)) {
            return Ok(());
        }
        if listed {
            return Err(format!(
                "{base_url}: http is only for loopback hosts; {host} must be called over https"
            ));
        }
        if documented.contains(&host.as_str()) && https && port == Some(443) {
            return Ok(());
        }
        let (scheme, port) = (url.scheme(), port.map_or("none".into(), |p| p.to_string()));
        let documents = match documented {
            [] => format!("{who} may reach only the hosts KEEL_PROVIDER_HOSTS lists"),
            _ => format!(
                "not a host {who} documents ({}, over https on port 443)",
                documented.join(", ")
            ),
        };
        Err(format!(
            "{host} (over {scheme}, port {port}): {documents}; the runtime operator must list \
             it in KEEL_PROVIDER_HOSTS"
        ))
    }
}

/// `localhost` and loopback addresses: plain http to them never leaves the machine.
fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn header_name(field: &'static str, name: String) -> Result<String, Invalid> {
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
    if !valid {
        return Err(Invalid::new(
            field,
            format!("{name:?} is not a header name"),
        ));
    }
    Ok(name)
}

fn check_headers(headers: &BTreeMap<String, String>) -> Result<(), Invalid> {
    for (name, value) in headers {
        header_name("headers", name.clone())?;
        if CREDENTIAL_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(Invalid::new(
                "headers",
                format!("{name} carries a credential; name it in secret_header_refs instead"),
            ));
        }
        if value.chars().any(char::is_control) {
            return Err(Invalid::new(
                "headers",
                format!("{name}: control characters"),
            ));
        }
    }
    Ok(())
}

fn check_capabilities(api: Api, kind: &str, capabilities: &[String]) -> Result<(), Invalid> {
    if api != Api::MediaJob {
        return match capabilities
            .iter()
            .find(|c| !CHAT_CAPABILITIES.contains(&c.as_str()))
        {
            Some(other) => Err(Invalid::new(
                "capabilities",
                format!(
                    "{other:?} is not a capability of a chat api; expected chat, tool_call or reasoning"
                ),
            )),
            None => Ok(()),
        };
    }
    let vendor = Vendor::parse(kind).ok_or_else(|| {
        Invalid::new(
            "kind",
            format!(
                "a media-job preset's kind names its vendor: openai-images, seedream or seedance, not {kind:?}"
            ),
        )
    })?;
    for capability in capabilities {
        let operation = Operation::parse(capability).ok_or_else(|| {
            Invalid::new(
                "capabilities",
                format!("{capability:?} is not a media operation"),
            )
        })?;
        if !vendor.supports(operation) {
            return Err(Invalid::new(
                "capabilities",
                format!("{} cannot {}", vendor.as_str(), operation.as_str()),
            ));
        }
    }
    Ok(())
}

fn check_inputs(input: &[String]) -> Result<(), Invalid> {
    match input.iter().find(|i| !INPUTS.contains(&i.as_str())) {
        Some(other) => Err(Invalid::new(
            "input",
            format!("{other:?} is not an input kind; expected text, image or video"),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields validated as a local operator's preset, under the default secret policy
    /// and hosts.
    fn validated(fields: ProviderFields) -> Result<ProviderSpec, Invalid> {
        fields.validate(
            &SecretPolicy::default(),
            &ProviderHosts::default(),
            &Caller::local(),
        )
    }

    /// The field such a preset is refused for.
    fn refused_field(fields: ProviderFields) -> &'static str {
        validated(fields).unwrap_err().field
    }

    fn seedance() -> ProviderFields {
        ProviderFields {
            kind: "seedance".into(),
            model: "seedance-1-0-pro".into(),
            api: "media-job".into(),
            base_url: "https://ark.ap-southeast.bytepluses.com/api/v3/".into(),
            api_key_ref: Some("env:ARK_API_KEY".into()),
            capabilities: vec!["video_generate".into()],
            ..ProviderFields::default()
        }
    }

    #[test]
    fn a_media_preset_validates_and_normalises() {
        let spec = validated(seedance()).unwrap();
        assert_eq!(
            spec.base_url,
            "https://ark.ap-southeast.bytepluses.com/api/v3"
        );
        assert_eq!(spec.provider_id, "seedance");
        assert_eq!(spec.display_name, "seedance-1-0-pro");
    }

    #[test]
    fn credentials_stay_out_of_plain_fields() {
        let mut fields = seedance();
        fields
            .headers
            .insert("Authorization".into(), "Bearer x".into());
        assert_eq!(refused_field(fields), "headers");
        let mut fields = seedance();
        fields.base_url = "https://user:pw@ark.ap-southeast.bytepluses.com".into();
        assert_eq!(refused_field(fields), "base_url");
        let mut fields = seedance();
        fields.api_key_ref = Some("sk-raw-key".into());
        assert_eq!(refused_field(fields), "api_key_ref");
        let mut fields = seedance();
        fields.api_key_ref = Some("env:KEEL_DATABASE_URL".into());
        let refused = validated(fields).unwrap_err();
        assert_eq!(refused.field, "api_key_ref");
        assert!(
            refused.message.contains("secret policy"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn free_json_postgres_could_not_give_back_is_refused() {
        let refused = [
            ("x", serde_json::json!([{ "y": -1.7976931348623157e308 }])),
            ("x", serde_json::json!({ "y": ["a\u{0}b"] })),
            ("x\u{0}", serde_json::json!(1)),
        ];
        for (key, value) in refused {
            let mut fields = seedance();
            fields.compat.insert(key.into(), value);
            let error = validated(fields).unwrap_err();
            assert_eq!(error.field, "compat", "{error}");
        }
        let mut fields = seedance();
        fields
            .compat
            .insert("x".into(), serde_json::json!(9_007_199_254_740_991u64));
        assert!(validated(fields).is_ok());
    }

    #[test]
    fn a_vendor_lists_only_what_it_can_do() {
        let mut fields = seedance();
        fields.capabilities = vec!["image_edit".into()];
        assert_eq!(refused_field(fields), "capabilities");
        let mut fields = seedance();
        fields.kind = "openai-compatible".into();
        assert_eq!(refused_field(fields), "kind");
    }

    #[test]
    fn a_base_url_aims_only_at_a_documented_or_listed_host() {
        let refused = |url: &str, hosts: &ProviderHosts| {
            let mut fields = seedance();
            fields.base_url = url.into();
            fields
                .validate(&SecretPolicy::default(), hosts, &Caller::local())
                .err()
                .map(|e| (e.field, e.message))
        };
        let none = ProviderHosts::default();
        for url in [
            "https://ark.ap-southeast.bytepluses.com/api/v3#x",
            "ftp://ark.ap-southeast.bytepluses.com/api/v3",
            "file:///etc/passwd",
            "https://a@ark.ap-southeast.bytepluses.com/api/v3",
            "http://169.254.169.254/latest",
            "https://api.openai.com/v1",
            "https://ark.ap-southeast.bytepluses.com.evil.example/api/v3",
        ] {
            let (field, message) = refused(url, &none).expect(url);
            assert_eq!(field, "base_url", "{url}: {message}");
        }
        let (_, message) = refused("http://127.0.0.1:9/v3", &none).unwrap();
        assert!(message.contains("KEEL_PROVIDER_HOSTS"), "{message}");
        assert!(refused("https://ark.cn-beijing.volces.com/api/v3", &none).is_none());
        assert!(refused("https://ARK.ap-southeast.bytepluses.com/api/v3/", &none).is_none());
        let listed = ProviderHosts::new(["127.0.0.1".to_string(), " [::1] ".to_string()]);
        assert!(refused("http://127.0.0.1:9/v3", &listed).is_none());
        assert!(refused("http://[::1]:9/v3", &listed).is_none());
        assert!(refused("http://169.254.169.254/latest", &listed).is_some());
        // A listed host over plain http only when it is loopback; documented hosts only
        // over https on 443; a listed port is the only one.
        let remote = ProviderHosts::new(["relay.example".to_string(), "127.0.0.1:8317".into()]);
        assert!(refused("http://relay.example/v3", &remote).is_some());
        assert!(refused("https://relay.example:8443/v3", &remote).is_none());
        assert!(refused("http://127.0.0.1:8317/v3", &remote).is_none());
        assert!(refused("http://127.0.0.1:8318/v3", &remote).is_some());
        assert!(refused("http://ark.cn-beijing.volces.com/api/v3", &none).is_some());
        assert!(refused("https://ark.cn-beijing.volces.com:8443/api/v3", &none).is_some());
    }

    fn remote(role: crate::domain::Role) -> Caller {
        let identity = crate::domain::identity::RemoteIdentity {
            actor_id: "alice".into(),
            org_id: "org_a".into(),
            runtime_id: "rt".into(),
            project_id: None,
            name: None,
            form: crate::domain::identity::IdentityForm::Headers,
        };
        Caller::remote(identity, role)
    }

    fn chat(base_url: &str, key: &str) -> ProviderFields {
        ProviderFields {
            kind: "openai-compatible".into(),
            model: "m".into(),
            api: "openai-completions".into(),
            base_url: base_url.into(),
            api_key_ref: Some(key.into()),
            capabilities: vec!["chat".into()],
            ..ProviderFields::default()
        }
    }

    #[test]
    fn the_runtime_operators_chat_preset_aims_anywhere_a_tenants_only_at_allowed_hosts() {
        let granted = SecretPolicy::default()
            .with_grants(&["org_a=env:ORG_A_API_KEY".into()])
            .unwrap();
        let none = ProviderHosts::default();
        let local = chat("http://127.0.0.1:8317/v1", "env:OPENAI_API_KEY");
        assert!(
            local
                .clone()
                .validate(&granted, &none, &Caller::local())
                .is_ok()
        );
        let runtime_operator = remote(crate::domain::Role::RuntimeOperator);
        assert!(local.validate(&granted, &none, &runtime_operator).is_ok());
        let refused = |fields: ProviderFields, hosts: &ProviderHosts| {
            let member = fields
                .clone()
                .validate(&granted, hosts, &remote(crate::domain::Role::Member))
                .err()
                .map(|e| e.field);
            // An org's operator is a tenant too: held to the same grants and hosts.
            let operator = fields
                .validate(&granted, hosts, &remote(crate::domain::Role::Operator))
                .err()
                .map(|e| e.field);
            assert_eq!(member, operator);
            member
        };
        let own = "env:ORG_A_API_KEY";
        assert_eq!(
            refused(chat("https://evil.example/v1", own), &none),
            Some("base_url")
        );
        assert_eq!(
            refused(chat("http://127.0.0.1:8317/v1", own), &none),
            Some("base_url")
        );
        assert_eq!(refused(chat("https://api.openai.com/v1", own), &none), None);
        let listed = ProviderHosts::new(["127.0.0.1".to_string()]);
        assert_eq!(
            refused(chat("http://127.0.0.1:8317/v1", own), &listed),
            None
        );
        // The deployment's key is not the tenant's to name, wherever it would go.
        let operators = chat("https://api.openai.com/v1", "env:OPENAI_API_KEY");
        assert_eq!(refused(operators, &none), Some("api_key_ref"));
        let mut header = chat("https://api.openai.com/v1", own);
        header
            .secret_header_refs
            .insert("x-extra".into(), "env:GITHUB_TOKEN".into());
        assert_eq!(refused(header, &none), Some("secret_header_refs"));
    }
}
