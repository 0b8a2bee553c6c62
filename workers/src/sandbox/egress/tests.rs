use std::path::PathBuf;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

use super::*;

/// A proxy on a socket of its own, with `allowed` as the deployment's list.
fn proxy(allowed: &[String]) -> (Egress, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rules = Arc::new(EgressRules::parse(allowed).unwrap().for_workspace(None));
    let egress = Egress::start(dir.path().join("egress.sock"), None, rules).unwrap();
    (egress, dir)
}

/// A TCP server on loopback that answers each connection with what it read of the
/// request's head, then closes; its address.
async fn echo_head_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = String::from_utf8_lossy(&head).into_owned();
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    address
}

async fn exchange(socket: &PathBuf, request: &[u8]) -> Vec<u8> {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    response
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn a_connect_to_loopback_is_refused_and_recorded() {
    let (egress, _dir) = proxy(&[]);
    let server = echo_head_server().await;
    let socket = egress.socket().to_path_buf();
    for target in [
        server.to_string(),
        "169.254.169.254:80".into(),
        "[::1]:22".into(),
    ] {
        let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
        let response = text(&exchange(&socket, request.as_bytes()).await);
        assert!(response.starts_with("HTTP/1.1 403"), "{target}: {response}");
        assert!(response.contains("not a public address"), "{response}");
    }
    let summary = egress.summary();
    assert_eq!((summary.connections, summary.refused), (0, 3));
    assert_eq!(summary.refusals[1].destination, "169.254.169.254:80");
    assert_eq!(summary.refusals[2].destination, "[::1]:22");
}

#[tokio::test]
async fn a_name_that_resolves_inward_is_refused() {
    let (egress, _dir) = proxy(&[]);
    let socket = egress.socket().to_path_buf();
    let request = b"GET http://localhost:9/x HTTP/1.1\r\nHost: localhost:9\r\n\r\n";
    let response = text(&exchange(&socket, request).await);
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(
        response.contains("localhost resolves to no public address"),
        "{response}"
    );
}

#[tokio::test]
async fn a_host_the_deployment_lists_is_reached_through_connect_and_plain_requests() {
    let server = echo_head_server().await;
    let (egress, _dir) = proxy(&[format!("127.0.0.1:{}", server.port())]);
    let socket = egress.socket().to_path_buf();

    let mut tunnel = UnixStream::connect(&socket).await.unwrap();
    let connect = format!("CONNECT {server} HTTP/1.1\r\n\r\nPING / HTTP/1.1\r\n\r\n");
    tunnel.write_all(connect.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tunnel.read_to_end(&mut response).await.unwrap();
    let response = text(&response);
    assert!(
        response.starts_with("HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK"),
        "{response}"
    );
    assert!(response.ends_with("PING / HTTP/1.1\r\n\r\n"), "{response}");

    let plain = format!(
        "GET http://{server}/path?q=1 HTTP/1.1\r\nHost: {server}\r\nProxy-Authorization: x\r\n\
         Proxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n"
    );
    let response = text(&exchange(&socket, plain.as_bytes()).await);
    // The origin server saw the request in origin form, without the proxy's headers.
    assert!(
        response.contains("GET /path?q=1 HTTP/1.1\r\n"),
        "{response}"
    );
    assert!(response.contains("Accept: */*\r\n"), "{response}");
    assert!(response.contains("Connection: close\r\n"), "{response}");
    assert!(
        !response.to_ascii_lowercase().contains("proxy-"),
        "{response}"
    );

    let summary = egress.summary();
    assert_eq!((summary.connections, summary.refused), (2, 0));
    assert!(
        summary.bytes_sent > 0 && summary.bytes_received > 0,
        "{summary:?}"
    );
}

#[tokio::test]
async fn socks5_refuses_inward_destinations_and_reaches_listed_ones() {
    let server = echo_head_server().await;
    let (egress, _dir) = proxy(&["localhost".to_string()]);
    let socket = egress.socket().to_path_buf();
    let reply_to = |request: Vec<u8>| {
        let socket = socket.clone();
        async move {
            let mut stream = UnixStream::connect(&socket).await.unwrap();
            stream.write_all(&[5, 1, 0]).await.unwrap();
            let mut chosen = [0u8; 2];
            stream.read_exact(&mut chosen).await.unwrap();
            assert_eq!(chosen, [5, 0]);
            stream.write_all(&request).await.unwrap();
            let mut reply = [0u8; 10];
            stream.read_exact(&mut reply).await.unwrap();
            (reply[1], stream)
        }
    };
    let port = server.port().to_be_bytes();
    // 169.254.169.254 as an address, and 127.0.0.1: not allowed.
    for address in [[169, 254, 169, 254], [127, 0, 0, 1]] {
        let request = [&[5, 1, 0, 1][..], &address, &port].concat();
        assert_eq!(reply_to(request).await.0, 2, "{address:?}");
    }
    // `localhost` by name: the deployment lists it.
    let name = b"localhost";
    let request = [&[5, 1, 0, 3, name.len() as u8][..], name, &port].concat();
    let (code, mut stream) = reply_to(request).await;
    assert_eq!(code, 0);
    stream.write_all(b"HELLO\r\n\r\n").await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    assert!(text(&response).ends_with("HELLO\r\n\r\n"));
    // BIND (2) is not served.
    let request = [&[5, 2, 0, 3, name.len() as u8][..], name, &port].concat();
    assert_eq!(reply_to(request).await.0, 7);
    let summary = egress.summary();
    assert_eq!(
        (summary.connections, summary.refused),
        (1, 3),
        "{summary:?}"
    );
}

#[tokio::test]
async fn a_malformed_request_gets_a_400() {
    let (egress, _dir) = proxy(&[]);
    let socket = egress.socket().to_path_buf();
    for request in [
        &b"GET /relative HTTP/1.1\r\n\r\n"[..],
        b"CONNECT nohost HTTP/1.1\r\n\r\n",
        b"\x01\x02\r\n\r\n",
    ] {
        let response = text(&exchange(&socket, request).await);
        assert!(response.starts_with("HTTP/1.1 400"), "{response}");
    }
}

#[test]
fn the_deployment_s_list_is_parsed_strictly() {
    let rules = EgressRules::parse(&[
        "Mirror.Internal".into(),
        "10.0.0.5:8080".into(),
        "[fd00::1]:443".into(),
        " ".into(),
    ])
    .unwrap()
    .for_workspace(None);
    assert!(rules.allows("mirror.internal", 1));
    assert!(rules.allows("10.0.0.5", 8080));
    assert!(!rules.allows("10.0.0.5", 80));
    assert!(rules.allows("fd00::1", 443));
    for bad in [":80", "host:http", "[::1", "=host", "org_a=", "org_a=:80"] {
        assert!(EgressRules::parse(&[bad.to_string()]).is_err(), "{bad}");
    }
}

#[test]
fn a_workspace_s_allowance_is_its_runs_alone() {
    let rules = EgressRules::parse(&[
        "mirror.internal".into(),
        "org_a=10.0.0.5:8080".into(),
        " org_b = registry.internal ".into(),
    ])
    .unwrap();
    let a = rules.for_workspace(Some("org_a"));
    assert!(a.allows("mirror.internal", 443));
    assert!(a.allows("10.0.0.5", 8080));
    assert!(!a.allows("registry.internal", 443));
    let b = rules.for_workspace(Some("org_b"));
    assert!(b.allows("registry.internal", 443));
    assert!(!b.allows("10.0.0.5", 8080));
    let unknown = rules.for_workspace(None);
    assert!(unknown.allows("mirror.internal", 443));
    assert!(!unknown.allows("10.0.0.5", 8080) && !unknown.allows("registry.internal", 443));
}
