//! The proxy's SOCKS5 side (RFC 1928), for what speaks no HTTP: no authentication, the
//! `CONNECT` command only, and a destination given as an IPv4 or IPv6 address or a name
//! (`socks5h://`, which the proxy resolves itself).

use std::net::{Ipv4Addr, Ipv6Addr};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};

use super::{Allowlist, Denied, Destination, Meter, SOCKS_VERSION, connect};

const NO_AUTHENTICATION: u8 = 0x00;
const NO_ACCEPTABLE_METHOD: u8 = 0xff;
const CONNECT: u8 = 0x01;
const IPV4: u8 = 0x01;
const DOMAIN: u8 = 0x03;
const IPV6: u8 = 0x04;

/// Reply codes.
const SUCCEEDED: u8 = 0x00;
const NOT_ALLOWED: u8 = 0x02;
const HOST_UNREACHABLE: u8 = 0x04;
const COMMAND_NOT_SUPPORTED: u8 = 0x07;
const ADDRESS_NOT_SUPPORTED: u8 = 0x08;

/// Reads the client's greeting and request and connects to where it goes. None: the
/// client was answered with the refusal or the error, and the connection ends.
pub(super) async fn open(
    client: &mut BufReader<UnixStream>,
    rules: &Allowlist,
    meter: &Meter,
) -> Option<TcpStream> {
    if !greet(client).await.ok()? {
        meter.refuse(
            "-".into(),
            "a SOCKS client that offers no unauthenticated method".into(),
        );
        return None;
    }
    let destination = match request(client).await.ok()? {
        Ok(destination) => destination,
        Err((code, why)) => {
            meter.refuse("-".into(), why);
            reply(client, code).await;
            return None;
        }
    };
    match connect(&destination, rules, meter).await {
        Ok(upstream) => {
            reply(client, SUCCEEDED).await;
            Some(upstream)
        }
        Err(Denied::Refused(_)) => {
            reply(client, NOT_ALLOWED).await;
            None
        }
        Err(Denied::Unreachable(_)) => {
            reply(client, HOST_UNREACHABLE).await;
            None
        }
    }
}

/// The method negotiation: whether the client takes no authentication (then chosen).
async fn greet(client: &mut BufReader<UnixStream>) -> std::io::Result<bool> {
    let [_version, count] = read_array(client).await?;
    let mut methods = vec![0u8; count as usize];
    client.read_exact(&mut methods).await?;
    let acceptable = methods.contains(&NO_AUTHENTICATION);
    let chosen = match acceptable {
        true => NO_AUTHENTICATION,
        false => NO_ACCEPTABLE_METHOD,
    };
    client.write_all(&[SOCKS_VERSION, chosen]).await?;
    Ok(acceptable)
}

/// The request's destination, or the reply code and reason it is refused with.
async fn request(
    client: &mut BufReader<UnixStream>,
) -> std::io::Result<Result<Destination, (u8, String)>> {
    let [version, command, _reserved, kind] = read_array(client).await?;
    if version != SOCKS_VERSION {
        return Ok(Err((
            COMMAND_NOT_SUPPORTED,
            format!("SOCKS version {version}"),
        )));
    }
    let host = match kind {
        IPV4 => Ipv4Addr::from(read_array::<4>(client).await?).to_string(),
        IPV6 => Ipv6Addr::from(read_array::<16>(client).await?).to_string(),
        DOMAIN => {
            let [length] = read_array(client).await?;
            let mut name = vec![0u8; length as usize];
            client.read_exact(&mut name).await?;
            String::from_utf8_lossy(&name).to_ascii_lowercase()
        }
        other => {
            let why = format!("SOCKS address type {other}");
            return Ok(Err((ADDRESS_NOT_SUPPORTED, why)));
        }
    };
    let port = u16::from_be_bytes(read_array(client).await?);
    if command != CONNECT {
        let why = format!("SOCKS command {command} (only CONNECT is served)");
        return Ok(Err((COMMAND_NOT_SUPPORTED, why)));
    }
    Ok(Ok(Destination { host, port }))
}

async fn read_array<const N: usize>(
    client: &mut BufReader<UnixStream>,
) -> std::io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    client.read_exact(&mut bytes).await?;
    Ok(bytes)
}

/// A reply with no bound address (clients ignore it for CONNECT).
async fn reply(client: &mut BufReader<UnixStream>, code: u8) {
    let reply = [SOCKS_VERSION, code, 0, IPV4, 0, 0, 0, 0, 0, 0];
    let _ = client.write_all(&reply).await;
}
