//! The console's browser session in local mode with a runtime token. The cookie is not the
//! token: it is `<expiry>.<HMAC-SHA256 of a label and the expiry, keyed by the token>`, so
//! it is stateless (every API replica with the same token accepts it), it ends at its
//! signed expiry and whenever the token rotates, and a leaked cookie does not reveal the
//! token. Requests the cookie authenticates that change state must also carry the CSRF
//! token (another HMAC of the token), which only a page of this origin can read from
//! `GET /console/session`.

use axum::http::HeaderMap;
use axum::http::header::COOKIE;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::api::auth::token;
use crate::api::auth::values::single;
use crate::config::Redacted;

/// The session cookie's name.
pub(crate) const COOKIE_NAME: &str = "keel_session";
/// The header a cookie-authenticated state-changing request carries its CSRF token in.
pub(crate) const CSRF_HEADER: &str = "x-keel-csrf";

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

/// The signature of a session that ends at `expires` (Unix seconds).
fn signature(token: &Redacted, expires: i64) -> Redacted {
    derive(token, &format!("{SESSION_LABEL}:{expires}"))
}

/// The session cookie's value for this runtime token, ending at `expires` (Unix seconds).
pub(crate) fn cookie_value(token: &Redacted, expires: i64) -> Redacted {
    let Ok(value) = format!("{expires}.{}", signature(token, expires).expose()).parse();
    value
}

/// The CSRF token of a session under this runtime token.
pub(crate) fn csrf_token(token: &Redacted) -> Redacted {
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

/// Whether one cookie value is a session of this token that has not ended by `now`.
fn valid(cookie: &str, token: &Redacted, now: i64) -> bool {
    let Some((expires, presented)) = cookie.split_once('.') else {
        return false;
    };
    let Ok(expires) = expires.parse::<i64>() else {
        return false;
    };
    // The signature covers the expiry, so a later one written into the cookie refuses.
    token::matches(presented, &signature(token, expires)) && now < expires
}

/// Whether the request carries a live session cookie of this token at `now` (Unix
/// seconds). Every such cookie is checked, so a stale one beside a fresh one refuses.
pub(crate) fn presented(headers: &HeaderMap, token: &Redacted, now: i64) -> bool {
    let mut cookies = session_cookies(headers).peekable();
    cookies.peek().is_some() && cookies.all(|c| valid(c, token, now))
}

/// Whether the request carries this session's CSRF token, exactly once.
pub(crate) fn csrf_presented(headers: &HeaderMap, token: &Redacted) -> bool {
    single(headers, CSRF_HEADER)
        .is_some_and(|presented| token::matches(presented, &csrf_token(token)))
}

/// The `Set-Cookie` value that signs a browser in for `ttl_secs` from `now`: the script
/// of a page cannot read it, no other site's request carries it, over https it never
/// travels in the clear, and the browser drops it when the server stops accepting it.
pub(crate) fn set_cookie(token: &Redacted, secure: bool, now: i64, ttl_secs: i64) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{COOKIE_NAME}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age={ttl_secs}{secure}",
        cookie_value(token, now + ttl_secs).expose()
    )
}

/// The `Set-Cookie` value that signs a browser out.
pub(crate) fn clear_cookie(secure: bool) -> String {
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

    /// A fixed "now" (Unix seconds) and a session ending an hour after it.
    const NOW: i64 = 1_800_000_000;
    const EXPIRES: i64 = NOW + 3600;

    #[test]
    fn the_cookie_is_derived_from_the_token_and_its_expiry_and_is_not_the_token() {
        let value = cookie_value(&token(), EXPIRES);
        let (expires, signature) = value.expose().split_once('.').unwrap();
        assert_eq!(
            (expires, signature.len()),
            (EXPIRES.to_string().as_str(), 64)
        );
        assert!(!value.expose().contains(token().expose()));
        assert_ne!(signature, csrf_token(&token()).expose());
        let other: Redacted = "another-token-of-16-chars".parse().unwrap();
        assert_ne!(value.expose(), cookie_value(&other, EXPIRES).expose());
        let later = cookie_value(&token(), EXPIRES + 1);
        assert_ne!(signature, later.expose().split_once('.').unwrap().1);
    }

    #[test]
    fn only_the_right_live_cookie_authenticates_and_a_wrong_one_beside_it_refuses() {
        let live = cookie_value(&token(), EXPIRES);
        let right = format!("theme=dark; {COOKIE_NAME}={}", live.expose());
        assert!(presented(&with_cookie(&right), &token(), NOW));
        assert!(!presented(&with_cookie("theme=dark"), &token(), NOW));
        assert!(!presented(
            &with_cookie(&format!("{COOKIE_NAME}={}", token().expose())),
            &token(),
            NOW
        ));
        let both = format!("{right}; {COOKIE_NAME}=stale");
        assert!(!presented(&with_cookie(&both), &token(), NOW));
    }

    #[test]
    fn a_session_ends_at_its_signed_expiry() {
        let cookie = |value: &str| with_cookie(&format!("{COOKIE_NAME}={value}"));
        let live = cookie_value(&token(), EXPIRES);
        assert!(presented(&cookie(live.expose()), &token(), EXPIRES - 1));
        assert!(!presented(&cookie(live.expose()), &token(), EXPIRES));
        // A later expiry written over the signed one does not extend the session.
        let signature = live.expose().split_once('.').unwrap().1;
        let extended = format!("{}.{signature}", EXPIRES + 86_400);
        assert!(!presented(&cookie(&extended), &token(), EXPIRES));
        assert!(!presented(&cookie(&extended), &token(), NOW));
        for malformed in ["", ".", "soon.abc", signature] {
            assert!(!presented(&cookie(malformed), &token(), NOW), "{malformed}");
        }
    }

    #[test]
    fn the_set_cookie_says_how_long_the_browser_keeps_it() {
        let header = set_cookie(&token(), false, NOW, 3600);
        let value = cookie_value(&token(), EXPIRES);
        assert!(
            header.contains(&format!("{COOKIE_NAME}={};", value.expose())),
            "{header}"
        );
        assert!(header.contains("; Max-Age=3600"), "{header}");
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
