//! `/console/session`: how the console signs a browser in and out, and what it needs to
//! know about its session. Open in the route policy (signing in is how a browser gets
//! credentials), so each handler checks the Host itself. And `/console/sign-in-codes`:
//! the one-time codes of sign-in links, for callers the route policy identified.

use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Form, Json};
use serde::Deserialize;

use crate::api::auth::SignInWith;
use crate::api::{ApiError, AppState};
use crate::domain::Caller;

/// The runtime token (the sign-in form) or a sign-in link's code, not both.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignInForm {
    token: Option<String>,
    code: Option<String>,
}

impl SignInForm {
    fn with(&self) -> Result<SignInWith<'_>, ApiError> {
        match (&self.token, &self.code) {
            (Some(token), None) => Ok(SignInWith::Token(token)),
            (None, Some(code)) => Ok(SignInWith::Code(code)),
            _ => Err(ApiError::invalid(
                "sign in with the runtime token (`token`) or a sign-in link's code (`code`)",
            )),
        }
    }
}

/// `GET`: the mode, how to sign in, whether this request is signed in, and the CSRF token.
pub(crate) async fn show(
    State(state): State<AppState>,
    request: Request,
) -> Result<Response, ApiError> {
    state.auth.check_host(&request)?;
    Ok(session_response(&state, request.headers(), None))
}

/// `POST` (JSON `{"token": …}` or `{"code": …}`, or a form): the runtime token or a
/// sign-in link's code, once, for a session cookie. A form post (a browser without
/// script) is sent back to the console.
pub(crate) async fn sign_in(
    State(state): State<AppState>,
    request: Request,
) -> Result<Response, ApiError> {
    state.auth.check_host(&request)?;
    state.auth.console_sign_in_offered()?;
    let secure = over_https(request.headers());
    let is_form = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let mut headers = request.headers().clone();
    let form = if is_form {
        let Form(form) = Form::<SignInForm>::from_request(request, &state)
            .await
            .map_err(|rejection| ApiError::invalid(rejection.body_text()))?;
        form
    } else {
        let Json(form) = Json::<SignInForm>::from_request(request, &state)
            .await
            .map_err(|rejection| ApiError::invalid(rejection.body_text()))?;
        form
    };
    let cookie = state.auth.console_sign_in(form.with()?, secure)?;
    if is_form {
        let mut response = Redirect::to("/console").into_response();
        set_cookie(&mut response, &cookie);
        return Ok(response);
    }
    // The session as the next request will see it: with the new cookie.
    let pair = cookie.split(';').next().unwrap_or_default();
    headers.insert(
        header::COOKIE,
        HeaderValue::from_str(pair).map_err(|e| ApiError::Internal(e.to_string()))?,
    );
    Ok(session_response(&state, &headers, Some(&cookie)))
}

/// `DELETE`: ends the browser's session (the cookie is cleared; the token stays valid).
pub(crate) async fn sign_out(
    State(state): State<AppState>,
    request: Request,
) -> Result<Response, ApiError> {
    state.auth.check_host(&request)?;
    let cookie = state.auth.console_sign_out(over_https(request.headers()));
    let mut headers = request.headers().clone();
    headers.remove(header::COOKIE);
    Ok(session_response(&state, &headers, Some(&cookie)))
}

/// `POST /console/sign-in-codes`: a code for a sign-in link (`keel console`), good for
/// one sign-in within minutes. Only local mode with a runtime token signs browsers in so;
/// the route policy has identified the caller, who holds the token (or a session).
pub(crate) async fn new_code(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<Response, ApiError> {
    let code = state.auth.console_sign_in_code()?;
    Ok((
        StatusCode::CREATED,
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        Json(crate::api::object("console_sign_in_code", code)),
    )
        .into_response())
}

/// The session JSON, never cached (it carries the CSRF token), with a cookie to set.
fn session_response(state: &AppState, headers: &HeaderMap, cookie: Option<&str>) -> Response {
    let session = crate::api::object("console_session", state.auth.console_session(headers));
    let mut response = (
        StatusCode::OK,
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        Json(session),
    )
        .into_response();
    if let Some(cookie) = cookie {
        set_cookie(&mut response, cookie);
    }
    response
}

fn set_cookie(response: &mut Response, cookie: &str) {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
}

/// Whether the browser reached us over https: directly, or through a proxy that says so.
fn over_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
}
