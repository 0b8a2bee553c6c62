//! `/console/session`: how the console signs a browser in and out, and what it needs to
//! know about its session. Open in the route policy (signing in is how a browser gets
//! credentials), so each handler checks the Host itself.

use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Form, Json};
use serde::Deserialize;

use crate::api::{ApiError, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignInForm {
    token: String,
}

/// `GET`: the mode, how to sign in, whether this request is signed in, and the CSRF token.
pub(crate) async fn show(
    State(state): State<AppState>,
    request: Request,
) -> Result<Response, ApiError> {
    state.auth.check_host(&request)?;
    Ok(session_response(&state, request.headers(), None))
}

/// `POST` (JSON `{"token": …}` or a form): the runtime token, once, for a session cookie.
/// A form post (a browser without script) is sent back to the console.
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
    let token = if is_form {
        let Form(form) = Form::<SignInForm>::from_request(request, &state)
            .await
            .map_err(|rejection| ApiError::invalid(rejection.body_text()))?;
        form.token
    } else {
        let Json(form) = Json::<SignInForm>::from_request(request, &state)
            .await
            .map_err(|rejection| ApiError::invalid(rejection.body_text()))?;
        form.token
    };
    let cookie = state.auth.console_sign_in(&token, secure)?;
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
