//! The proxy's HTTP side: `CONNECT host:port` opens a tunnel (https, and anything else a
//! client tunnels); a plain request in absolute form (`GET http://host/path`) is passed on
//! in origin form, with the proxy's own headers removed, and the connection closes after
//! its response.

use std::sync::atomic::Ordering;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};

use super::{Allowlist, Denied, Destination, Meter, connect};

/// The most a request's head may take.
const MAX_HEAD_BYTES: usize = 32 * 1024;
const MAX_HEADERS: usize = 100;

/// Reads the client's request and connects to where it goes. None: the client was
/// answered with the refusal or the error, and the connection ends.
pub(super) async fn open(
    client: &mut BufReader<UnixStream>,
    rules: &Allowlist,
    meter: &Meter,
) -> Option<TcpStream> {
    let head = match read_head(client).await {
        Ok(head) => head,
        Err(why) => {
            meter.refuse("-".into(), why.clone());
            answer(client, "400 Bad Request", &why).await;
            return None;
        }
    };
    let request = match parse(&head) {
        Ok(request) => request,
        Err(why) => {
            meter.refuse("-".into(), why.clone());
            answer(client, "400 Bad Request", &why).await;
            return None;
        }
    };
    let mut upstream = match connect(&request.destination, rules, meter).await {
        Ok(upstream) => upstream,
        Err(Denied::Refused(why)) => {
            answer(client, "403 Forbidden", &why).await;
            return None;
        }
        Err(Denied::Unreachable(why)) => {
            answer(client, "502 Bad Gateway", &why).await;
            return None;
        }
    };
    let sent = match &request.forward {
        None => {
            let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
            client.write_all(established).await
        }
        Some(head) => {
            meter.sent.fetch_add(head.len() as u64, Ordering::Relaxed);
            upstream.write_all(head).await
        }
    };
    sent.ok()?;
    Some(upstream)
}

async fn read_head(client: &mut BufReader<UnixStream>) -> Result<Vec<u8>, String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > MAX_HEAD_BYTES {
            return Err(format!("the request's head is over {MAX_HEAD_BYTES} bytes"));
        }
        let read = client
            .read_until(b'\n', &mut head)
            .await
            .map_err(|e| format!("reading the request: {e}"))?;
        if read == 0 {
            return Err("the connection closed before its request ended".into());
        }
    }
    Ok(head)
}

/// A request: where it goes, and for a plain request the head to send there.
#[derive(Debug)]
struct Request {
    destination: Destination,
    forward: Option<Vec<u8>>,
}

fn parse(head: &[u8]) -> Result<Request, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err("an incomplete request".into()),
        Err(error) => return Err(format!("a malformed request: {error}")),
    }
    let (method, target) = (request.method.unwrap_or(""), request.path.unwrap_or(""));
    if method == "CONNECT" {
        let destination = authority(target)?;
        return Ok(Request {
            destination,
            forward: None,
        });
    }
    let url = url::Url::parse(target)
        .map_err(|_| format!("{target:?} is not an absolute http:// URL"))?;
    if url.scheme() != "http" {
        return Err(format!(
            "{} requests go through CONNECT, not as a plain request",
            url.scheme()
        ));
    }
    let host = match url.host() {
        Some(url::Host::Domain(name)) => name.to_string(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        None => return Err(format!("{target:?} has no host")),
    };
    let destination = Destination {
        host,
        port: url.port_or_known_default().unwrap_or(80),
    };
    let origin = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_string(),
    };
    let forward = origin_form(method, &origin, request.headers, &url);
    Ok(Request {
        destination,
        forward: Some(forward),
    })
}

/// The request as the origin server takes it: its path, the client's headers but the
/// proxy's own, and `Connection: close` (the next request may be for another host, which
/// this connection cannot reach).
fn origin_form(
    method: &str,
    origin: &str,
    headers: &[httparse::Header],
    url: &url::Url,
) -> Vec<u8> {
    let hop_by_hop = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
    ];
    let mut head = format!("{method} {origin} HTTP/1.1\r\n").into_bytes();
    let mut has_host = false;
    for header in headers {
        let name = header.name.to_ascii_lowercase();
        if hop_by_hop.contains(&name.as_str()) {
            continue;
        }
        has_host |= name == "host";
        head.extend_from_slice(header.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(header.value);
        head.extend_from_slice(b"\r\n");
    }
    if !has_host {
        let host = url.host_str().unwrap_or_default();
        let host = match url.port() {
            Some(port) => format!("Host: {host}:{port}\r\n"),
            None => format!("Host: {host}\r\n"),
        };
        head.extend_from_slice(host.as_bytes());
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    head
}

/// `host:port` (or `[v6]:port`), as `CONNECT` names its destination.
fn authority(target: &str) -> Result<Destination, String> {
    let invalid = || format!("{target:?} is not host:port");
    let (host, port) = match target.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']').ok_or_else(invalid)?;
            (host, after.strip_prefix(':'))
        }
        None => match target.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (target, None),
        },
    };
    let port = port
        .and_then(|port| port.parse::<u16>().ok())
        .ok_or_else(invalid)?;
    if host.is_empty() {
        return Err(invalid());
    }
    Ok(Destination {
        host: host.to_ascii_lowercase(),
        port,
    })
}

/// Answers the client with `status` and `why`, from the proxy itself.
async fn answer(client: &mut BufReader<UnixStream>, status: &str, why: &str) {
    let body = format!("keel egress proxy: {why}\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}
