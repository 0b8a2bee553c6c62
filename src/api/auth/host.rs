//! The Host allowlist: a web page that reaches a local Keel through DNS rebinding sends its
//! own domain as `Host`, which is not on the list. Matching ignores the port: the listen
//! port is not what an attacker controls, the name is.

use std::net::SocketAddr;

use axum::extract::Request;
use axum::http::header::HOST;

/// Loopback names every local runtime answers to.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

#[derive(Debug, Clone)]
pub struct HostAllowlist {
    /// `*` was configured: any Host is allowed.
    any: bool,
    /// Normalised host names, without ports.
    names: Vec<String>,
}

impl HostAllowlist {
    /// The configured names, or (when none are) the loopback names and the listen address.
    pub fn new(configured: &[String], listen: SocketAddr) -> HostAllowlist {
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
                names.push(host_name(&listen.to_string()));
            }
            names
        } else {
            configured.into_iter().map(host_name).collect()
        };
        HostAllowlist { any: false, names }
    }

    /// Whether the request addresses an allowed host (`Host`, or the HTTP/2 authority).
    pub fn allows(&self, request: &Request) -> bool {
        if self.any {
            return true;
        }
        let host = request
            .headers()
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| request.uri().authority().map(|a| a.as_str()));
        host.is_some_and(|host| self.names.contains(&host_name(host)))
    }
}

/// `Example.COM.:8420` → `example.com`, `[::1]:8420` → `[::1]`.
fn host_name(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    let name = match host.strip_prefix('[') {
        Some(rest) => rest
            .split_once(']')
            .map_or(host.clone(), |(ip, _)| format!("[{ip}]")),
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name.to_string(),
            _ => host.clone(),
        },
    };
    name.trim_end_matches('.').to_string()
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
            assert!(list.allows(&request(allowed)), "{allowed}");
        }
        for refused in [
            "evil.example",
            "evil.example:8420",
            "127.0.0.2",
            "localhost.evil",
        ] {
            assert!(!list.allows(&request(refused)), "{refused}");
        }
    }

    #[test]
    fn a_configured_list_replaces_the_default_and_a_star_allows_any() {
        let names = vec!["keel.example.com".to_string(), "Other.example:443".into()];
        let list = HostAllowlist::new(&names, "127.0.0.1:8420".parse().unwrap());
        assert!(list.allows(&request("keel.example.com:8420")));
        assert!(list.allows(&request("other.example.")));
        assert!(!list.allows(&request("localhost")));
        let any = HostAllowlist::new(&["*".to_string()], "127.0.0.1:8420".parse().unwrap());
        assert!(any.allows(&request("anything.example")));
    }
}
