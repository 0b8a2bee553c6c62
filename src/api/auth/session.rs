//! The console's browser session in local mode with a runtime token. The cookie is not the
//! token: it is HMAC-SHA256 of a fixed label keyed by the token, so it is stateless (every
//! API replica with the same token accepts it), it dies when the token rotates, and a leaked
//! cookie does not reveal the token. Requests the cookie authenticates that change state
//! must also carry the CSRF token (another HMAC of the token), which only a page of this
//! origin can read from `GET /console/session`.

use axum::http::HeaderMap;
use axum::http::header::COOKIE;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::token;
use crate::config::Redacted;

/// The session cookie's name.
pub const COOKIE_NAME: &str = "keel_session";
/// The header a cookie-authenticated state-changing request carries its CSRF token in.
pub const CSRF_HEADER: &str = "x-keel-csrf";

const SESSION_LABEL: &str = "keel-console-session";
const CSRF_LABEL: &str = "keel-console-csrf";

/// HMAC-SHA256 of `label` keyed by the runtime token, in hex.
fn derive(token: &Redacted, label: &str) -> Redacted {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(label.as_bytes());
    let Ok(derived) = hex::encode(mac.finalize().into_bytes()).parse();
    derived
}

/// The session cookie's value for this runtime token.
pub fn cookie_value(token: &Redacted) -> Redacted {
    derive(token, SESSION_LABEL)
}

/// The CSRF token of a session under this runtime token.
pub fn csrf_token(token: &Redacted) -> Redacted {
    derive(token, CSRF_LABEL)
}

/// The values of every `keel_session` cookie the request carries.
fn session_cookies(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.trim())
}

/// Whether the request carries a session cookie of this token. Every such cookie is
/// compared, in constant time, so a stale one beside a fresh one refuses.
pub fn presented(headers: &HeaderMap, token: &Redacted) -> bool {
    let expected = cookie_value(token);
    let mut cookies = session_cookies(headers).peekable();
    cookies.peek().is_some() && cookies.all(|c| token::matches(c, &expected))
}

/// Whether the request carries this session's CSRF token, exactly once.
pub fn csrf_presented(headers: &HeaderMap, token: &Redacted) -> bool {
    super::headers::single(headers, CSRF_HEADER)
        .is_some_and(|presented| token::matches(presented, &csrf_token(token)))
}

/// The `Set-Cookie` value that signs a browser in: the script of a page cannot read it,
/// no other site's request carries it, and over https it never travels in the clear.
pub fn set_cookie(token: &Redacted, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{COOKIE_NAME}={}; HttpOnly; SameSite=Strict; Path=/{secure}",
        cookie_value(token).expose()
    )
}

/// The `Set-Cookie` value that signs a browser out.
pub fn clear_cookie(secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE_NAME}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn token() -> Redacted {
        "a-token-of-sixteen-chars".parse().unwrap()
    }

    fn with_cookie(cookie: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(COOKIE, HeaderValue::from_str(cookie).unwrap());
        headers
    }

    #[test]
    fn the_cookie_is_derived_from_the_token_and_is_not_the_token() {
        let value = cookie_value(&token());
        assert_eq!(value.expose().len(), 64);
        assert!(!value.expose().contains(token().expose()));
        assert_ne!(value.expose(), csrf_token(&token()).expose());
        let other: Redacted = "another-token-of-16-chars".parse().unwrap();
        assert_ne!(value.expose(), cookie_value(&other).expose());
    }

    #[test]
    fn only_the_right_cookie_authenticates_and_a_wrong_one_beside_it_refuses() {
        let right = format!(
            "theme=dark; {COOKIE_NAME}={}",
            cookie_value(&token()).expose()
        );
        assert!(presented(&with_cookie(&right), &token()));
        assert!(!presented(&with_cookie("theme=dark"), &token()));
        assert!(!presented(
            &with_cookie(&format!("{COOKIE_NAME}={}", token().expose())),
            &token()
        ));
        let both = format!("{right}; {COOKIE_NAME}=stale");
        assert!(!presented(&with_cookie(&both), &token()));
    }

    #[test]
    fn the_csrf_header_must_be_this_sessions() {
        let mut headers = HeaderMap::new();
        assert!(!csrf_presented(&headers, &token()));
        headers.insert(
            CSRF_HEADER,
            HeaderValue::from_str(csrf_token(&token()).expose()).unwrap(),
        );
        assert!(csrf_presented(&headers, &token()));
        headers.insert(CSRF_HEADER, HeaderValue::from_static("wrong"));
        assert!(!csrf_presented(&headers, &token()));
    }
}
