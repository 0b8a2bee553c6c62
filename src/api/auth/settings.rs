//! The API's authentication settings, checked once at start: a runtime that would be
//! reachable without credentials, or a remote mode that could verify nobody, refuses to
//! start instead.

use std::net::SocketAddr;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::headers;
use super::host::HostAllowlist;
use super::jwt::{IDENTITY_HEADER, JwtVerifier, Rejected};
use super::ratelimit::Limiter;
use super::token;
use crate::config::{AuthArgs, Redacted};
use crate::domain::Caller;
use crate::domain::identity::RemoteIdentity;
use crate::domain::identity::checked_id;

/// Shortest runtime token or shared secret accepted.
const MIN_SECRET_LEN: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "refusing to listen on {0} without authentication: anyone who reaches the port could \
         run commands. Set KEEL_RUNTIME_TOKEN (--runtime-token), or KEEL_REMOTE_MODE=1 with \
         an identity verifier, or listen on a loopback address"
    )]
    Unprotected(SocketAddr),
    #[error("{0}")]
    Invalid(String),
}

pub use keel_api_types::RuntimeMode;

enum Credentials {
    /// Local mode: the runtime token, when one is configured.
    Local(Option<Redacted>),
    Remote(Remote),
}

struct Remote {
    runtime_id: String,
    jwt: Option<JwtVerifier>,
    shared_secret: Option<Redacted>,
}

pub struct Auth {
    credentials: Credentials,
    pub(super) hosts: HostAllowlist,
    pub(super) limiter: Option<Limiter>,
    cors_origins: Vec<HeaderValue>,
    label: String,
}

impl Auth {
    pub fn from_args(args: &AuthArgs, listen: SocketAddr) -> Result<Auth, SettingsError> {
        let credentials = if args.remote_mode {
            Credentials::Remote(Remote::from_args(args)?)
        } else {
            let token = checked_secret(&args.runtime_token, "KEEL_RUNTIME_TOKEN")?;
            if token.is_none() && !listen.ip().is_loopback() {
                return Err(SettingsError::Unprotected(listen));
            }
            Credentials::Local(token)
        };
        let cors_origins = args
            .cors_origins
            .iter()
            .map(|o| o.trim())
            .filter(|o| !o.is_empty())
            .map(|origin| {
                HeaderValue::from_str(origin).map_err(|_| {
                    SettingsError::Invalid(format!(
                        "KEEL_CORS_ORIGINS: '{origin}' is not an origin"
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Auth {
            credentials,
            hosts: HostAllowlist::new(&args.allowed_hosts, listen),
            limiter: args.rate_limit.map(Limiter::new),
            cors_origins,
            label: args.runtime_label.clone().unwrap_or_else(host_name),
        })
    }

    /// Local mode without a token, on a loopback `listen` address.
    pub fn local(listen: SocketAddr) -> Result<Auth, SettingsError> {
        Auth::from_args(&AuthArgs::default(), listen)
    }

    pub fn mode(&self) -> RuntimeMode {
        match self.credentials {
            Credentials::Local(_) => RuntimeMode::Local,
            Credentials::Remote(_) => RuntimeMode::Remote,
        }
    }

    /// The runtime's label in `GET /v1/whoami`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// CORS for the configured origins; none configured, no CORS headers at all.
    pub fn cors(&self) -> Option<CorsLayer> {
        if self.cors_origins.is_empty() {
            return None;
        }
        let headers = [
            "authorization",
            "content-type",
            "last-event-id",
            "traceparent",
            "x-request-id",
            token::RUNTIME_TOKEN_HEADER,
        ];
        Some(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(self.cors_origins.clone()))
                .allow_methods([
                    Method::GET,
                    Method::POST,
                    Method::PUT,
                    Method::PATCH,
                    Method::DELETE,
                ])
                .allow_headers(headers.map(HeaderName::from_static))
                .expose_headers([
                    HeaderName::from_static("x-request-id"),
                    axum::http::header::RETRY_AFTER,
                ]),
        )
    }

    /// The caller the request's credentials prove, in this runtime's mode.
    pub(super) fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, Rejected> {
        match &self.credentials {
            Credentials::Local(None) => Ok(Caller::local()),
            Credentials::Local(Some(token)) => token::presented(headers, token)
                .then(Caller::local)
                .ok_or("missing or wrong runtime token"),
            Credentials::Remote(remote) => remote.identify(headers).map(Caller::remote),
        }
    }
}

impl Remote {
    fn from_args(args: &AuthArgs) -> Result<Remote, SettingsError> {
        let runtime_id = args
            .runtime_id
            .as_deref()
            .and_then(checked_id)
            .ok_or_else(|| {
                SettingsError::Invalid(
                    "remote mode needs KEEL_RUNTIME_ID: 1 to 128 printable characters, no spaces"
                        .into(),
                )
            })?;
        let leeway = args.remote_jwt_leeway_secs;
        let verifiers = [
            args.remote_jwt_secret.is_some(),
            args.remote_jwt_public_key.is_some(),
            args.remote_jwks_file.is_some(),
        ];
        if verifiers.iter().filter(|set| **set).count() > 1 {
            return Err(SettingsError::Invalid(
                "set one of KEEL_REMOTE_JWT_SECRET, KEEL_REMOTE_JWT_PUBLIC_KEY and \
                 KEEL_REMOTE_JWKS_FILE, not several"
                    .into(),
            ));
        }
        let jwt = if let Some(secret) = &args.remote_jwt_secret {
            Some(JwtVerifier::hs256(secret.expose(), &runtime_id, leeway)?)
        } else if let Some(path) = &args.remote_jwt_public_key {
            Some(JwtVerifier::public_key_file(path, &runtime_id, leeway)?)
        } else if let Some(path) = &args.remote_jwks_file {
            Some(JwtVerifier::jwks_file(path, &runtime_id, leeway)?)
        } else {
            None
        };
        let shared_secret =
            checked_secret(&args.remote_shared_secret, "KEEL_REMOTE_SHARED_SECRET")?;
        if jwt.is_none() && shared_secret.is_none() {
            return Err(SettingsError::Invalid(
                "remote mode needs a verifier: KEEL_REMOTE_JWT_SECRET, KEEL_REMOTE_JWT_PUBLIC_KEY, \
                 KEEL_REMOTE_JWKS_FILE or KEEL_REMOTE_SHARED_SECRET"
                    .into(),
            ));
        }
        Ok(Remote {
            runtime_id,
            jwt,
            shared_secret,
        })
    }

    /// A JWT when the request carries one, else the header form. Identity headers only
    /// count with the shared secret, so in JWT-only mode they are refused like any guess.
    fn identify(&self, headers: &HeaderMap) -> Result<RemoteIdentity, Rejected> {
        if headers.contains_key(IDENTITY_HEADER) {
            let jwt = self
                .jwt
                .as_ref()
                .ok_or("JWT identities are not configured")?;
            let token = headers::single(headers, IDENTITY_HEADER).ok_or("malformed JWT header")?;
            return jwt.verify(token);
        }
        match &self.shared_secret {
            Some(secret) => headers::verify(headers, secret, &self.runtime_id),
            None => Err("no identity JWT"),
        }
    }
}

/// A configured secret, refused when it is too short to be one.
fn checked_secret(
    secret: &Option<Redacted>,
    name: &str,
) -> Result<Option<Redacted>, SettingsError> {
    match secret {
        Some(s) if s.expose().chars().count() < MIN_SECRET_LEN => Err(SettingsError::Invalid(
            format!("{name} must be at least {MIN_SECRET_LEN} characters"),
        )),
        other => Ok(other.clone()),
    }
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "keel".into())
}
