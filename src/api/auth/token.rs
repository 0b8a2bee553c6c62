//! The runtime token of local mode, and the constant-time comparison every shared secret
//! goes through.

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use subtle::ConstantTimeEq;

use crate::config::Redacted;

pub(crate) const RUNTIME_TOKEN_HEADER: &str = "x-keel-runtime-token";

/// Whether `presented` is the secret, in time that does not depend on where they differ.
pub(crate) fn matches(presented: &str, secret: &Redacted) -> bool {
    presented
        .as_bytes()
        .ct_eq(secret.expose().as_bytes())
        .into()
}

/// Whether the request carries the runtime token, as `Authorization: Bearer <token>` or
/// `X-Keel-Runtime-Token: <token>`. Every presented value is compared, so a second header
/// cannot hide a right one, nor a right one vouch for a wrong one sent beside it.
pub(crate) fn presented(headers: &HeaderMap, token: &Redacted) -> bool {
    let bearer = headers
        .get_all(AUTHORIZATION)
        .iter()
        .map(|value| value.to_str().ok().and_then(bearer_token));
    let direct = headers
        .get_all(RUNTIME_TOKEN_HEADER)
        .iter()
        .map(|value| value.to_str().ok());
    let mut candidates = bearer.chain(direct).peekable();
    candidates.peek().is_some() && candidates.all(|c| c.is_some_and(|c| matches(c, token)))
}

/// Whether the request sends a token header at all, right or wrong.
pub(crate) fn offered(headers: &HeaderMap) -> bool {
    headers.contains_key(AUTHORIZATION) || headers.contains_key(RUNTIME_TOKEN_HEADER)
}

/// The token of an `Authorization: Bearer <token>` value (the scheme is case-insensitive).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn both_headers_carry_the_token_and_a_wrong_one_beside_it_refuses() {
        let token: Redacted = "a-token-of-sixteen-chars".parse().unwrap();
        assert!(presented(
            &headers(&[("authorization", "Bearer a-token-of-sixteen-chars")]),
            &token
        ));
        assert!(presented(
            &headers(&[("authorization", "bearer a-token-of-sixteen-chars")]),
            &token
        ));
        assert!(presented(
            &headers(&[(RUNTIME_TOKEN_HEADER, "a-token-of-sixteen-chars")]),
            &token
        ));
        assert!(!presented(&headers(&[]), &token));
        assert!(!presented(
            &headers(&[("authorization", "Basic a-token-of-sixteen-chars")]),
            &token
        ));
        assert!(!presented(
            &headers(&[
                (RUNTIME_TOKEN_HEADER, "a-token-of-sixteen-chars"),
                ("authorization", "Bearer wrong")
            ]),
            &token
        ));
    }
}
