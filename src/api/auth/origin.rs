//! Cross-site requests: a web page can make a browser send a request to any Keel the
//! browser reaches, a local one without a token above all, and a `text/plain` POST needs no
//! CORS preflight. A state-changing request the browser marks as another site's
//! (`Sec-Fetch-Site: cross-site`), or whose `Origin` is not this server's own, is refused,
//! unless that origin is one the operator allowed (`KEEL_CORS_ORIGINS`). Clients that are
//! not browsers send neither header.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::http::header::{HOST, ORIGIN};

/// Why a state-changing request is refused as cross-site, or None when it is not.
pub(crate) fn cross_site(
    request: &Request,
    allowed_origins: &[HeaderValue],
) -> Option<&'static str> {
    if request.method().is_safe() {
        return None;
    }
    let headers = request.headers();
    let origin = headers.get(ORIGIN);
    if origin.is_some_and(|origin| allowed_origins.contains(origin)) {
        return None;
    }
    if headers
        .get("sec-fetch-site")
        .is_some_and(|site| site.as_bytes().eq_ignore_ascii_case(b"cross-site"))
    {
        return Some("the browser marked this request as another site's (Sec-Fetch-Site)");
    }
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    match origin {
        Some(origin) if !same_origin(origin.to_str().unwrap_or("null"), host) => {
            Some("the request's Origin is not this server's")
        }
        _ => None,
    }
}

/// Whether `origin` (`scheme://host[:port]`) names the authority the request addressed,
/// the scheme's default port filled in on both sides. `null` and anything else is not.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => "80",
        "https" => "443",
        _ => return false,
    };
    host.is_some_and(|host| {
        with_port(authority, default_port) == with_port(host.trim(), default_port)
    })
}

/// `Example.com` → `example.com:80`, `[::1]` → `[::1]:80`; an authority with a port as it
/// is (lowercased).
fn with_port(authority: &str, default_port: &str) -> String {
    let authority = authority.to_ascii_lowercase();
    let after_address = authority
        .rsplit_once(']')
        .map_or(authority.as_str(), |(_, r)| r);
    if after_address.contains(':') {
        authority
    } else {
        format!("{authority}:{default_port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(headers: &[(&str, &str)]) -> Request {
        let mut request = Request::builder().method("POST").uri("/v1/tasks");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn changes_from_other_origins_are_refused_and_the_servers_own_pass() {
        let allowed = [HeaderValue::from_static("https://ui.example")];
        let host = ("host", "127.0.0.1:8420");
        for passing in [
            vec![host],
            vec![host, ("origin", "http://127.0.0.1:8420")],
            vec![
                host,
                ("origin", "http://127.0.0.1:8420"),
                ("sec-fetch-site", "same-origin"),
            ],
            vec![
                ("host", "keel.example"),
                ("origin", "https://keel.example:443"),
            ],
            vec![("host", "[::1]:80"), ("origin", "http://[::1]")],
            vec![
                host,
                ("origin", "https://ui.example"),
                ("sec-fetch-site", "cross-site"),
            ],
        ] {
            assert_eq!(cross_site(&post(&passing), &allowed), None, "{passing:?}");
        }
        for refused in [
            vec![host, ("sec-fetch-site", "cross-site")],
            vec![host, ("origin", "https://evil.example")],
            vec![host, ("origin", "http://127.0.0.1:3000")],
            vec![host, ("origin", "null")],
        ] {
            assert!(
                cross_site(&post(&refused), &allowed).is_some(),
                "{refused:?}"
            );
        }
        let mut get = post(&[host, ("origin", "https://evil.example")]);
        *get.method_mut() = axum::http::Method::GET;
        assert_eq!(
            cross_site(&get, &allowed),
            None,
            "reads are CORS's to guard"
        );
    }
}
