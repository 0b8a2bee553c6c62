//! The Host allowlist: a web page that reaches a local Keel through DNS rebinding sends its
//! own domain as `Host`, which is not on the list. Matching ignores the port: the listen
//! port is not what an attacker controls, the name is. The header is parsed strictly
//! (`[::1]evil.example` is no host) and must be sent once: a proxy and Keel reading
//! different Hosts of one request would check different names.

use std::net::{Ipv6Addr, SocketAddr};

use axum::extract::Request;
use axum::http::header::HOST;

use crate::api::ApiError;

/// Loopback names every local runtime answers to.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

#[derive(Debug, Clone)]
pub(crate) struct HostAllowlist {
    /// `*` was configured: any Host is allowed.
    any: bool,
    /// Normalised host names, without ports.
    names: Vec<String>,
}

impl HostAllowlist {
    /// The configured names, or (when none are) the loopback names and the listen address.
    pub(crate) fn new(configured: &[String], listen: SocketAddr) -> HostAllowlist {
        let configured: Vec<&str> = configured
            .iter()
            .map(|h| h.trim())
            .filter(|h| !h.is_empty())
            .collect();
        if configured.contains(&"*") {
            return HostAllowlist {
                any: true,
                names: Vec::new(),
            };
        }
        let names = if configured.is_empty() {
            let mut names: Vec<String> = LOOPBACK_NAMES.iter().map(|n| n.to_string()).collect();
            // An unspecified address (0.0.0.0) is no name a client can address.
            if !listen.ip().is_unspecified() {
                names.extend(host_name(&listen.to_string()));
            }
            names
        } else {
            // A configured entry that is no host name could match no request.
            configured.into_iter().filter_map(host_name).collect()
        };
        HostAllowlist { any: false, names }
    }

    /// Whether the request addresses an allowed host (`Host`, or the HTTP/2 authority):
    /// 400 for a malformed or repeated Host, 403 for one not on the list.
    pub(crate) fn check(&self, request: &Request) -> Result<(), ApiError> {
        let mut hosts = request.headers().get_all(HOST).iter();
        let host = match (hosts.next(), hosts.next()) {
            (Some(host), None) => host.to_str().ok(),
            (None, _) => request.uri().authority().map(|a| a.as_str()),
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "the request has more than one Host header",
                ));
            }
        };
        let Some(name) = host.and_then(host_name) else {
            return Err(ApiError::invalid(
                "the Host header is missing or is not a host name, IPv4 address or [IPv6] \
                 address with an optional port",
            ));
        };
        if self.any || self.names.contains(&name) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "the Host header names a host this runtime does not serve (KEEL_ALLOWED_HOSTS)"
                    .into(),
            ))
        }
    }
}

/// `Example.COM.:8420` → `example.com`, `[::1]:8420` → `[::1]`; None for anything that is
/// not a name (letters, digits, `-`, `_`, `.`), or an IPv6 address in brackets, followed
/// by nothing or `:` and a port.
fn host_name(host: &str) -> Option<String> {
    let host = host.trim().to_ascii_lowercase();
    let (name, rest) = match host.strip_prefix('[') {
        Some(bracketed) => {
            let (ip, rest) = bracketed.split_once(']')?;
            ip.parse::<Ipv6Addr>().ok()?;
            (format!("[{ip}]"), rest)
        }
        None => {
            let (name, rest) = host.split_at(host.find(':').unwrap_or(host.len()));
            let named = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
            if name.is_empty() || !name.bytes().all(named) {
                return None;
            }
            (name.to_string(), rest)
        }
    };
    let port_ok = match rest.strip_prefix(':') {
        Some(port) => (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit()),
        None => rest.is_empty(),
    };
    port_ok.then(|| name.trim_end_matches('.').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(host: &str) -> Request {
        Request::builder()
            .uri("/v1/tasks")
            .header(HOST, host)
            .body(axum::body::Body::empty())
            .unwrap()
    }

    #[test]
    fn the_default_list_is_loopback_and_the_listen_address_on_any_port() {
        let list = HostAllowlist::new(&[], "10.1.2.3:8420".parse().unwrap());
        for allowed in [
            "localhost:8420",
            "LOCALHOST",
            "127.0.0.1:1",
            "[::1]:8420",
            "10.1.2.3",
        ] {
            assert!(list.check(&request(allowed)).is_ok(), "{allowed}");
        }
        for refused in [
            "evil.example",
            "evil.example:8420",
            "127.0.0.2",
            "localhost.evil",
        ] {
            assert!(
                matches!(list.check(&request(refused)), Err(ApiError::Forbidden(_))),
                "{refused}"
            );
        }
    }

    #[test]
    fn malformed_and_repeated_hosts_are_bad_requests_even_when_any_is_allowed() {
        let any = HostAllowlist::new(&["*".to_string()], "127.0.0.1:8420".parse().unwrap());
        for malformed in [
            "[::1]evil.example",
            "[::1]:80evil",
            "[not-v6]",
            "localhost:80:80",
            "localhost:",
            "localhost:123456",
            "local host",
            "evil.example/x",
            "user@localhost",
            "",
        ] {
            let refused = any.check(&request(malformed));
            assert!(
                matches!(&refused, Err(ApiError::Invalid { status, .. }) if status.as_u16() == 400),
                "{malformed}: {refused:?}"
            );
        }
        let mut twice = request("localhost");
        twice
            .headers_mut()
            .append(HOST, "evil.example".parse().unwrap());
        assert!(matches!(any.check(&twice), Err(ApiError::Invalid { .. })));
    }

    #[test]
    fn a_configured_list_replaces_the_default_and_a_star_allows_any() {
        let names = vec!["keel.example.com".to_string(), "Other.example:443".into()];
        let list = HostAllowlist::new(&names, "127.0.0.1:8420".parse().unwrap());
        assert!(list.check(&request("keel.example.com:8420")).is_ok());
        assert!(list.check(&request("other.example.")).is_ok());
        assert!(list.check(&request("localhost")).is_err());
        let any = HostAllowlist::new(&["*".to_string()], "127.0.0.1:8420".parse().unwrap());
        assert!(any.check(&request("anything.example")).is_ok());
    }
}
