//! The egress proxy: the one way out of a run's network namespace. Every jail with network
//! gets one, run by the worker outside the sandbox and reached from inside through a Unix
//! socket bound into it ([`super::shim`] turns that socket into the loopback addresses the
//! run's `HTTP_PROXY` and `ALL_PROXY` name). It speaks HTTP (`CONNECT`, and plain requests
//! in absolute form) and SOCKS5, told apart by their first byte, resolves names itself, and
//! connects only to the addresses Keel's address policy calls public ([`crate::address`]),
//! or to a host the deployment lists ([`EgressRules`]). It counts what passes and keeps
//! what it refused, for the run's record ([`EgressSummary`]).

mod http;
mod socks;

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll};

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::address::is_public;

/// How long a client may take to say where it is going.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long resolving a name, and each connection attempt, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Connections one jail may hold open through the proxy at once: each costs the worker
/// two file descriptors, which a run must not exhaust.
const MAX_CONNECTIONS: usize = 256;
/// Refusals a summary keeps (their count is kept whole).
const MAX_REFUSALS_KEPT: usize = 20;

/// Hosts the deployment lets runs reach although they resolve to addresses that are not
/// public (an internal package mirror, a test server): `host` or `host:port`, the host a
/// name or an IP literal, matched exactly (case-insensitively) against what the run asked
/// for. `WORKSPACE=host[:port]` lets only that workspace's runs reach it. Set by the
/// deployment only (`KEEL_SANDBOX_EGRESS_ALLOW`), never by a tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressRules {
    allowed: Vec<Allowance>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Allowance {
    /// None: every workspace's runs.
    workspace: Option<String>,
    host: String,
    port: Option<u16>,
}

impl EgressRules {
    /// Parses the deployment's list; an entry with a port that is not a number, or with no
    /// host or no workspace before its `=`, is refused.
    pub fn parse(entries: &[String]) -> Result<EgressRules, String> {
        let allowed = entries
            .iter()
            .map(|entry| entry.trim())
            .filter(|entry| !entry.is_empty())
            .map(parse_allowance)
            .collect::<Result<_, _>>()?;
        Ok(EgressRules { allowed })
    }

    /// What one run of `workspace` may reach: the allowances for every workspace and those
    /// for its own (only the former when the run's workspace is unknown).
    pub(crate) fn for_workspace(&self, workspace: Option<&str>) -> Allowlist {
        let hosts = self
            .allowed
            .iter()
            .filter(|allowance| {
                allowance
                    .workspace
                    .as_deref()
                    .is_none_or(|only| Some(only) == workspace)
            })
            .map(|allowance| (allowance.host.clone(), allowance.port))
            .collect();
        Allowlist { hosts }
    }
}

/// The hosts one egress proxy lets its run reach although they are not public.
#[derive(Debug, Default)]
pub(crate) struct Allowlist {
    hosts: Vec<(String, Option<u16>)>,
}

impl Allowlist {
    fn allows(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().any(|(allowed, only)| {
            allowed.eq_ignore_ascii_case(host) && only.is_none_or(|only| only == port)
        })
    }
}

/// `[WORKSPACE=]` followed by a host and an optional port.
fn parse_allowance(entry: &str) -> Result<Allowance, String> {
    let (workspace, host_port) = match entry.split_once('=') {
        Some((workspace, _)) if workspace.trim().is_empty() => {
            return Err(format!(
                "egress allowance {entry:?}: no workspace before '='"
            ));
        }
        Some((workspace, rest)) => (Some(workspace.trim().to_string()), rest.trim()),
        None => (None, entry),
    };
    let (host, port) = parse_host_port(host_port)?;
    Ok(Allowance {
        workspace,
        host,
        port,
    })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn parse_host_port(entry: &str) -> Result<(String, Option<u16>), String> {
    let invalid = |why: &str| format!("egress allowance {entry:?}: {why}");
    let (host, port) = match entry.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest
                .split_once(']')
                .ok_or_else(|| invalid("no closing ]"))?;
            (host, after.strip_prefix(':'))
        }
        // One colon is a port; more is an IPv6 address without one.
        None => match entry.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => (host, Some(port)),
            _ => (entry, None),
        },
    };
    if host.is_empty() {
        return Err(invalid("no host"));
    }
    let port = port
        .map(|port| {
            port.parse::<u16>()
                .map_err(|_| invalid("the port is not a number"))
        })
        .transpose()?;
    Ok((host.to_ascii_lowercase(), port))
}

/// What one jail's processes sent and received through the proxy, and what it refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EgressSummary {
    /// Connections made to a destination.
    pub connections: u64,
    /// Requests refused (a destination that is not public, a malformed request, too many
    /// connections at once).
    pub refused: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// The first refusals, each its destination and why.
    pub refusals: Vec<Refusal>,
}

impl EgressSummary {
    /// Whether the run used the proxy at all.
    pub fn is_empty(&self) -> bool {
        self.connections == 0 && self.refused == 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// `host:port` as the run asked for it (or what could be read of its request).
    pub destination: String,
    pub reason: String,
}

#[derive(Debug, Default)]
struct Meter {
    connections: AtomicU64,
    refused: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
    refusals: Mutex<Vec<Refusal>>,
}

impl Meter {
    fn refuse(&self, destination: String, reason: String) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%destination, %reason, "a run's egress was refused");
        let mut refusals = self.refusals.lock().unwrap();
        if refusals.len() < MAX_REFUSALS_KEPT {
            refusals.push(Refusal {
                destination,
                reason,
            });
        }
    }

    fn summary(&self) -> EgressSummary {
        EgressSummary {
            connections: self.connections.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            bytes_sent: self.sent.load(Ordering::Relaxed),
            bytes_received: self.received.load(Ordering::Relaxed),
            refusals: self.refusals.lock().unwrap().clone(),
        }
    }
}

/// One jail's proxy: its socket, and the task serving it, which ends (with every
/// connection through it) when this is dropped.
#[derive(Debug)]
pub(crate) struct Egress {
    socket: PathBuf,
    meter: Arc<Meter>,
    server: tokio::task::JoinHandle<()>,
}

impl Egress {
    /// Listens on `socket` (which must not exist), connectable only by `owner` (the jail's
    /// uid; this process's own when None).
    pub(crate) fn start(
        socket: PathBuf,
        owner: Option<u32>,
        rules: Arc<Allowlist>,
    ) -> std::io::Result<Egress> {
        let listener = UnixListener::bind(&socket)?;
        let guard = Removal(socket);
        if let Some(uid) = owner {
            std::os::unix::fs::chown(&guard.0, Some(uid), Some(uid))?;
        }
        std::fs::set_permissions(&guard.0, std::fs::Permissions::from_mode(0o600))?;
        let meter = Arc::new(Meter::default());
        let server = tokio::spawn(serve(listener, rules, meter.clone()));
        Ok(Egress {
            socket: guard.disarm(),
            meter,
            server,
        })
    }

    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    pub(crate) fn summary(&self) -> EgressSummary {
        self.meter.summary()
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.server.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Removes a socket whose set-up failed halfway.
struct Removal(PathBuf);

impl Removal {
    fn disarm(self) -> PathBuf {
        let path = self.0.clone();
        std::mem::forget(self);
        path
    }
}

impl Drop for Removal {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Accepts the jail's connections; dropping (aborting) it drops every one in flight.
async fn serve(listener: UnixListener, rules: Arc<Allowlist>, meter: Arc<Meter>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "the egress proxy stopped accepting");
                    return;
                }
            },
            Some(_) = connections.join_next() => continue,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            let why = format!("more than {MAX_CONNECTIONS} connections at once");
            meter.refuse("-".into(), why);
            continue;
        };
        let (rules, meter) = (rules.clone(), meter.clone());
        connections.spawn(async move {
            relay(stream, &rules, &meter).await;
            drop(slot);
        });
    }
}

/// Where a client asked to go.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Destination {
    host: String,
    port: u16,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.host.contains(':') {
            true => write!(f, "[{}]:{}", self.host, self.port),
            false => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// Why a connection was not made: the policy refused it, or it could not be made.
#[derive(Debug)]
enum Denied {
    Refused(String),
    Unreachable(String),
}

/// The protocol a client speaks, by its first byte: SOCKS5 starts with its version, 5;
/// HTTP with a method's first letter.
const SOCKS_VERSION: u8 = 5;

async fn relay(stream: UnixStream, rules: &Allowlist, meter: &Meter) {
    let mut client = BufReader::new(stream);
    let opened = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        match first_byte(&mut client).await? {
            SOCKS_VERSION => socks::open(&mut client, rules, meter).await,
            _ => http::open(&mut client, rules, meter).await,
        }
    })
    .await;
    let Ok(Some(mut upstream)) = opened else {
        return;
    };
    meter.connections.fetch_add(1, Ordering::Relaxed);
    let counted = copy_counted(&mut client, &mut upstream, meter).await;
    if let Err(error) = counted {
        tracing::debug!(%error, "an egress connection ended with an error");
    }
}

async fn first_byte(client: &mut BufReader<UnixStream>) -> Option<u8> {
    use tokio::io::AsyncBufReadExt;
    client.fill_buf().await.ok()?.first().copied()
}

/// Copies both ways until both sides are done, adding what passes to the meter as it
/// passes (a connection the jail's end cuts off has been counted up to then).
async fn copy_counted(
    client: &mut (impl AsyncRead + AsyncWrite + Unpin),
    upstream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    meter: &Meter,
) -> std::io::Result<()> {
    let mut client = Counted {
        stream: client,
        read: &meter.sent,
    };
    let mut upstream = Counted {
        stream: upstream,
        read: &meter.received,
    };
    tokio::io::copy_bidirectional(&mut client, &mut upstream)
        .await
        .map(drop)
}

/// A stream that adds every byte read from it to a counter.
struct Counted<'a, S> {
    stream: &'a mut S,
    read: &'a AtomicU64,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut *this.stream).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        this.read.fetch_add(read, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Connects to `destination` if the policy lets it, recording a refusal in the meter.
async fn connect(
    destination: &Destination,
    rules: &Allowlist,
    meter: &Meter,
) -> Result<TcpStream, Denied> {
    let connected = reach(destination, rules).await;
    if let Err(Denied::Refused(reason) | Denied::Unreachable(reason)) = &connected {
        meter.refuse(destination.to_string(), reason.clone());
    }
    connected
}

async fn reach(destination: &Destination, rules: &Allowlist) -> Result<TcpStream, Denied> {
    let Destination { host, port } = destination;
    if *port == 0 {
        return Err(Denied::Refused("port 0".into()));
    }
    let allowed = rules.allows(host, *port);
    if let Ok(ip) = host.parse::<IpAddr>()
        && !allowed
        && !is_public(ip)
    {
        return Err(Denied::Refused(format!("{ip} is not a public address")));
    }
    let resolved = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host((&**host, *port)))
        .await
        .map_err(|_| Denied::Unreachable(format!("resolving {host} timed out")))?
        .map_err(|error| Denied::Unreachable(format!("resolving {host}: {error}")))?;
    let addresses: Vec<SocketAddr> = resolved
        .filter(|address| allowed || is_public(address.ip()))
        .collect();
    if addresses.is_empty() {
        return Err(Denied::Refused(format!(
            "{host} resolves to no public address"
        )));
    }
    let mut last = String::new();
    for address in addresses {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(error)) => last = format!("connecting to {address}: {error}"),
            Err(_) => last = format!("connecting to {address} timed out"),
        }
    }
    Err(Denied::Unreachable(last))
}

#[cfg(test)]
mod tests;
