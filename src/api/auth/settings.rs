//! The API's authentication settings, checked once at start: a runtime that would be
//! reachable without credentials, or a remote mode that could verify nobody, refuses to
//! start instead.

use std::net::SocketAddr;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use keel_api_types::ConsoleSignInCode;
use serde::Serialize;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::api::ApiError;
use crate::api::auth::codes::SignInCodes;
use crate::api::auth::error::{Rejected, SettingsError};
use crate::api::auth::host::HostAllowlist;
use crate::api::auth::jwt::{IDENTITY_HEADER, JwtVerifier};
use crate::api::auth::ratelimit::Limiter;
use crate::api::auth::values::single;
use crate::api::auth::{headers, origin, session, token};
use crate::config::{AuthArgs, MAX_CONSOLE_SESSION_SECS, Redacted};
use crate::domain::identity::RemoteIdentity;
use crate::domain::identity::checked_id;
use crate::domain::{Caller, Role};

/// Shortest runtime token or shared secret accepted.
const MIN_SECRET_LEN: usize = 16;

pub(crate) use keel_api_types::RuntimeMode;

enum Credentials {
    /// Local mode: the runtime token, when one is configured.
    Local(Option<Redacted>),
    Remote(Remote),
}

struct Remote {
    runtime_id: String,
    jwt: Option<JwtVerifier>,
    shared_secret: Option<Redacted>,
    /// Whether the header form's `X-Keel-Role` counts (`KEEL_REMOTE_ROLE_HEADER`).
    role_header: bool,
}

pub struct Auth {
    credentials: Credentials,
    pub(super) hosts: HostAllowlist,
    pub(super) limiter: Option<Limiter>,
    cors_origins: Vec<HeaderValue>,
    label: String,
    console_session_ttl_secs: i64,
    /// The codes of the console's sign-in links, issued and not yet used.
    sign_in_codes: SignInCodes,
    allow_self_approval: bool,
}

/// The time a console session's expiry is compared with (Unix seconds).
fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

impl Auth {
    pub(crate) fn from_args(args: &AuthArgs, listen: SocketAddr) -> Result<Auth, SettingsError> {
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
            limiter: args.rate_limit_in_effect().map(Limiter::new),
            cors_origins,
            label: args.runtime_label.clone().unwrap_or_else(host_name),
            // The flag's parser bounds it already; the clamp makes the cast lossless.
            console_session_ttl_secs: args.console_session_ttl_secs.min(MAX_CONSOLE_SESSION_SECS)
                as i64,
            sign_in_codes: SignInCodes::default(),
            allow_self_approval: args.allow_self_approval,
        })
    }

    /// Local mode without a token, on a loopback `listen` address.
    pub(crate) fn local(listen: SocketAddr) -> Result<Auth, SettingsError> {
        Auth::from_args(&AuthArgs::default(), listen)
    }

    pub(crate) fn mode(&self) -> RuntimeMode {
        match self.credentials {
            Credentials::Local(_) => RuntimeMode::Local,
            Credentials::Remote(_) => RuntimeMode::Remote,
        }
    }

    /// Whether the request addresses a host this runtime serves (`KEEL_ALLOWED_HOSTS`), in
    /// one well-formed Host header: open routes that check credentials themselves ask first.
    pub(crate) fn check_host(&self, request: &axum::extract::Request) -> Result<(), ApiError> {
        self.hosts.check(request)
    }

    /// Whether `caller` may resolve an approval it requested: in local mode (one person)
    /// always, in remote mode only with `KEEL_ALLOW_SELF_APPROVAL`.
    pub(crate) fn may_approve_own(&self, caller: &Caller) -> bool {
        caller.is_local() || self.allow_self_approval
    }

    /// The runtime's label in `GET /v1/whoami`.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// Why a state-changing request is refused as another site's (see [`origin`]), or None.
    pub(crate) fn cross_site(&self, request: &axum::extract::Request) -> Option<&'static str> {
        origin::cross_site(request, &self.cors_origins)
    }

    /// CORS for the configured origins; none configured, no CORS headers at all.
    pub(crate) fn cors(&self) -> Option<CorsLayer> {
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

    /// The caller the request's credentials prove, in this runtime's mode, and how. The
    /// console's cookie counts only when no token header is sent: a wrong header is
    /// refused as before, whatever cookie rides along.
    pub(super) fn authenticate(&self, headers: &HeaderMap) -> Result<(Caller, Proof), Rejected> {
        match &self.credentials {
            Credentials::Local(None) => Ok((Caller::local(), Proof::Credentials)),
            Credentials::Local(Some(token)) if token::offered(headers) => {
                token::presented(headers, token)
                    .then(|| (Caller::local(), Proof::Credentials))
                    .ok_or("missing or wrong runtime token")
            }
            Credentials::Local(Some(token)) => session::presented(headers, token, unix_now())
                .then(|| (Caller::local(), Proof::Cookie))
                .ok_or("missing or wrong runtime token"),
            Credentials::Remote(remote) => remote
                .identify(headers)
                .map(|(identity, role)| (Caller::remote(identity, role), Proof::Credentials)),
        }
    }

    /// The runtime token, in local mode when one is configured: what a console session is
    /// derived from.
    fn session_token(&self) -> Option<&Redacted> {
        match &self.credentials {
            Credentials::Local(token) => token.as_ref(),
            Credentials::Remote(_) => None,
        }
    }

    /// Whether a cookie-authenticated request carries its session's CSRF token.
    pub(super) fn csrf_presented(&self, headers: &HeaderMap) -> bool {
        self.session_token()
            .is_some_and(|token| session::csrf_presented(headers, token))
    }

    /// What the console's `GET /console/session` tells a browser: how it signs in,
    /// whether the request is signed in, and (for a cookie session) its CSRF token.
    pub(crate) fn console_session(&self, headers: &HeaderMap) -> ConsoleSession {
        let caller = self.authenticate(headers).ok();
        let sign_in = match (&self.credentials, self.session_token()) {
            (Credentials::Remote(_), _) => SignIn::Proxy,
            (_, Some(_)) => SignIn::Token,
            (_, None) => SignIn::None,
        };
        let csrf_token = self
            .session_token()
            .filter(|_| caller.is_some())
            .map(|token| session::csrf_token(token).expose().to_string());
        ConsoleSession {
            mode: self.mode(),
            sign_in,
            signed_in: caller.is_some(),
            actor_id: caller.map(|(caller, _)| caller.actor_id),
            csrf_token,
        }
    }

    /// The `Set-Cookie` value that ends a console session.
    pub(crate) fn console_sign_out(&self, secure: bool) -> String {
        session::clear_cookie(secure)
    }

    /// Whether this runtime signs browsers in with its token: only local mode with one.
    pub(crate) fn console_sign_in_offered(&self) -> Result<(), ApiError> {
        match &self.credentials {
            Credentials::Remote(_) => Err(ApiError::Forbidden(
                "remote mode: your proxy signs you in".into(),
            )),
            Credentials::Local(None) => Err(ApiError::Conflict(
                "this runtime has no token: there is nothing to sign in to".into(),
            )),
            Credentials::Local(Some(_)) => Ok(()),
        }
    }

    /// The `Set-Cookie` value of a console session, when the browser shows the runtime
    /// token (compared in constant time, like the bearer header) or a live sign-in code.
    pub(crate) fn console_sign_in(
        &self,
        with: SignInWith<'_>,
        secure: bool,
    ) -> Result<String, ApiError> {
        self.console_sign_in_offered()?;
        let token = self
            .session_token()
            .ok_or(ApiError::Unauthorized("this runtime has no token"))?;
        let proven = match with {
            SignInWith::Token(presented) => token::matches(presented, token),
            SignInWith::Code(code) => self.sign_in_codes.redeem(code, unix_now()),
        };
        if !proven {
            return Err(ApiError::Unauthorized(
                "wrong console token, or a sign-in code that is wrong, used or expired",
            ));
        }
        let ttl = self.console_session_ttl_secs;
        Ok(session::set_cookie(token, secure, unix_now(), ttl))
    }

    /// A one-time code for the console's sign-in link (`keel console`), when this runtime
    /// signs browsers in with its token.
    pub(crate) fn console_sign_in_code(&self) -> Result<ConsoleSignInCode, ApiError> {
        self.console_sign_in_offered()?;
        let (code, expires) = self.sign_in_codes.issue(unix_now());
        Ok(ConsoleSignInCode {
            code: code.expose().to_string(),
            expires_at: chrono::DateTime::from_timestamp(expires, 0).unwrap_or_default(),
        })
    }
}

/// What a browser signs in to the console with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SignInWith<'a> {
    /// The runtime token, typed into the sign-in form.
    Token(&'a str),
    /// The code of a sign-in link, good once.
    Code(&'a str),
}

/// How a request's caller was proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proof {
    /// A header the request's sender set: the token, an identity JWT or identity headers.
    Credentials,
    /// The console's session cookie, which a browser attaches by itself.
    Cookie,
}

/// How the console signs a browser in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SignIn {
    /// Local mode with a runtime token: the token, once, for a session cookie.
    Token,
    /// Local mode without a token: nothing to sign in to.
    None,
    /// Remote mode: the proxy's identity.
    Proxy,
}

/// The console's view of its session.
#[derive(Debug, Serialize)]
pub(crate) struct ConsoleSession {
    pub(crate) mode: RuntimeMode,
    pub(crate) sign_in: SignIn,
    pub(crate) signed_in: bool,
    pub(crate) actor_id: Option<String>,
    /// Sent as `X-Keel-CSRF` with every state-changing request of the session.
    pub(crate) csrf_token: Option<String>,
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
        if args.remote_role_header && shared_secret.is_none() {
            return Err(SettingsError::Invalid(
                "KEEL_REMOTE_ROLE_HEADER is for the header form: it needs \
                 KEEL_REMOTE_SHARED_SECRET"
                    .into(),
            ));
        }
        Ok(Remote {
            runtime_id,
            jwt,
            shared_secret,
            role_header: args.remote_role_header,
        })
    }

    /// A JWT when the request carries one, else the header form. Identity headers only
    /// count with the shared secret, so in JWT-only mode they are refused like any guess.
    fn identify(&self, headers: &HeaderMap) -> Result<(RemoteIdentity, Role), Rejected> {
        if headers.contains_key(IDENTITY_HEADER) {
            let jwt = self
                .jwt
                .as_ref()
                .ok_or("JWT identities are not configured")?;
            let token = single(headers, IDENTITY_HEADER).ok_or("malformed JWT header")?;
            return jwt.verify(token);
        }
        match &self.shared_secret {
            Some(secret) => headers::verify(headers, secret, &self.runtime_id, self.role_header),
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
