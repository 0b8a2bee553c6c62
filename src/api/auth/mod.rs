//! Who may call the API: every request gets a [`Caller`] here or is refused. Handlers take
//! the caller as an extractor, so a route cannot forget to ask for it.
//!
//! In order: open routes (probes, the console's assets and session endpoints) pass; the
//! Host must be well-formed and on the allowlist; a change must not come from another
//! site's page; the credentials of the runtime's mode must prove a caller
//! (in local mode with a token, the console's session cookie also does, with its CSRF
//! header on changes); the route must be in the policy table (and a local-only route needs
//! local access); and the caller must be within its rate limit.

mod codes;
mod error;
mod headers;
mod host;
mod jwt;
mod origin;
mod policy;
mod ratelimit;
mod session;
mod settings;
mod token;
mod values;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::ApiError;
use crate::domain::Caller;
pub use error::SettingsError;
use policy::Lookup;
pub(crate) use policy::local_only_actions;
pub use policy::{PAGE_ROUTES, ROUTE_POLICY, RouteClass};
pub use settings::Auth;
use settings::Proof;
pub(crate) use settings::RuntimeMode;
pub(crate) use settings::SignInWith;

/// Whether this request may use local-only routes (see [`policy::local_access`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalAccess(pub(crate) bool);

/// Identifies the caller of every request, or refuses it.
pub(crate) async fn identify(
    State(auth): State<Arc<Auth>>,
    mut request: Request,
    next: Next,
) -> Response {
    match admit(&auth, &request) {
        Ok(None) => next.run(request).await,
        Ok(Some((caller, access))) => {
            let span = tracing::Span::current();
            span.record("actor", caller.actor_id.as_str());
            span.record("workspace", caller.scope.workspace());
            request.extensions_mut().insert(caller);
            request.extensions_mut().insert(access);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

/// The caller and its local access, or None for an open route.
fn admit(auth: &Auth, request: &Request) -> Result<Option<(Caller, LocalAccess)>, ApiError> {
    // An unmatched path has no class: it is authenticated like any other, then answered 404.
    let lookup = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| policy::classify(request.method(), path.as_str()));
    if lookup == Some(Lookup::Class(RouteClass::Open)) {
        return Ok(None);
    }
    auth.hosts.check(request)?;
    if let Some(why) = auth.cross_site(request) {
        return Err(ApiError::Forbidden(format!(
            "{why}: changes are accepted only from this server's own pages and the origins \
             in KEEL_CORS_ORIGINS"
        )));
    }
    let (caller, proof) = auth
        .authenticate(request.headers())
        .map_err(ApiError::Unauthorized)?;
    // A browser attaches the cookie to any request to this origin, so a change it proves
    // must also show the session's CSRF token, which only this origin's pages can read.
    if proof == Proof::Cookie
        && !request.method().is_safe()
        && !auth.csrf_presented(request.headers())
    {
        return Err(ApiError::Forbidden(
            "a console session's changes need its X-Keel-CSRF header (GET /console/session)".into(),
        ));
    }
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0);
    let access = LocalAccess(policy::local_access(
        auth.mode() == RuntimeMode::Remote,
        peer,
        request.headers(),
    ));
    match lookup {
        Some(Lookup::Unclassified) => {
            return Err(ApiError::Forbidden(
                "this route is not in the route policy".into(),
            ));
        }
        Some(Lookup::OtherMethod) => {
            return Err(ApiError::method_not_allowed(
                request.method(),
                request.uri().path(),
            ));
        }
        Some(Lookup::Class(RouteClass::LocalOnly)) if !access.0 => {
            return Err(ApiError::Forbidden(
                "this action is local-only: it is refused in remote mode, from non-loopback \
                 peers and through proxies"
                    .into(),
            ));
        }
        _ => {}
    }
    if let Some(limiter) = &auth.limiter {
        limiter
            .check(&caller)
            .map_err(|wait| ApiError::RateLimited {
                retry_after: wait.as_secs_f64().ceil().max(1.0) as u64,
            })?;
    }
    Ok(Some((caller, access)))
}

/// Fails closed: `identify` runs before every handler, and a request it did not identify is
/// a wiring bug.
fn identified<T: Clone + Send + Sync + 'static>(parts: &Parts) -> Result<T, ApiError> {
    parts
        .extensions
        .get::<T>()
        .cloned()
        .ok_or_else(|| ApiError::Internal("the request was not identified".into()))
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        identified(parts)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for LocalAccess {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        identified(parts)
    }
}
