//! Where the worker's outbound HTTP may go, and how its failures read. Vendor calls, media
//! downloads and the agent's HTTP reach only http(s) and (unless the limits allow it) only
//! public addresses, checked on every connection and every redirect; [`refusal`] finds the
//! filter's [`Refused`] in a reqwest error, and [`describe`] spells out the error's causes.

use std::error::Error;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::{ClientBuilder, redirect};
use url::{Host, Url};

const MAX_REDIRECTS: usize = 5;

/// A client builder whose connections reach only public addresses (unless
/// `allow_private`): names resolve through [`PublicOnly`], and the connection uses the
/// addresses it checked, so a name rebound between check and connect cannot aim inward.
pub(crate) fn guarded(builder: ClientBuilder, allow_private: bool) -> ClientBuilder {
    // A proxy would resolve names itself, past the address filter.
    let builder = builder.no_proxy();
    if allow_private {
        builder
    } else {
        builder.dns_resolver(Arc::new(PublicOnly))
    }
}

/// Follows a few redirects, each target checked like the first URL.
pub(crate) fn checked_redirects(allow_private: bool) -> redirect::Policy {
    redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(Refused("too many redirects".into()));
        }
        match check_url(attempt.url(), allow_private) {
            Ok(()) => attempt.follow(),
            Err(why) => attempt.error(why),
        }
    })
}

pub(crate) fn refusal<'e>(error: &'e (dyn Error + 'static)) -> Option<&'e Refused> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(refused) = error.downcast_ref::<Refused>() {
            return Some(refused);
        }
        cause = error.source();
    }
    None
}

/// reqwest's own message is terse ("error sending request"); the cause is in its sources.
pub(crate) fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Why a download target was refused; found again in reqwest's error chain.
#[derive(Debug)]
pub(crate) struct Refused(pub(crate) String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for Refused {}

/// Scheme and IP-literal checks; names are checked when they resolve, by [`PublicOnly`],
/// because only the connection's address is safe from DNS rebinding.
pub(crate) fn check_url(url: &Url, allow_private: bool) -> Result<(), Refused> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Refused(format!("scheme {:?} is not http(s)", url.scheme())));
    }
    let ip = match url.host() {
        None => return Err(Refused("the URL has no host".into())),
        Some(Host::Domain(_)) => return Ok(()),
        Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
        Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
    };
    if allow_private || is_public(ip) {
        Ok(())
    } else {
        Err(Refused(format!("{ip} is not a public address")))
    }
}

/// [`guarded`] for a reqwest 0.13 client (the MCP SDK's), which also never follows a
/// redirect: a server's requests carry its credentials.
pub(crate) fn guarded_13(
    builder: reqwest13::ClientBuilder,
    allow_private: bool,
) -> reqwest13::ClientBuilder {
    let builder = builder
        .no_proxy()
        .redirect(reqwest13::redirect::Policy::none());
    if allow_private {
        builder
    } else {
        builder.dns_resolver(PublicOnly)
    }
}

/// Resolves names to their public addresses only, at connect time.
struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move { Ok(Box::new(public_addresses(host).await?.into_iter()) as Addrs) })
    }
}

impl reqwest13::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest13::dns::Name) -> reqwest13::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addresses = public_addresses(host).await?.into_iter();
            Ok(Box::new(addresses) as reqwest13::dns::Addrs)
        })
    }
}

/// The public addresses `host` resolves to; refused when it has none.
async fn public_addresses(host: String) -> Result<Vec<SocketAddr>, Box<dyn Error + Send + Sync>> {
    let resolved = tokio::net::lookup_host((host.as_str(), 0)).await?;
    let public: Vec<SocketAddr> = resolved.filter(|addr| is_public(addr.ip())).collect();
    if public.is_empty() {
        let why = format!("{host} resolves to no public address");
        return Err(Box::new(Refused(why)));
    }
    Ok(public)
}

pub(super) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_public_v4(ip),
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            Some(mapped) => is_public_v4(mapped),
            None => is_public_v6(ip),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let special = ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (carrier-grade NAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast: relays to any IPv4 address
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240; // reserved
    !special
}

/// The IPv6 ranges of IANA's special-purpose registry that are not globally reachable, or
/// that reach an address Keel cannot check (a tunnel or translator to an embedded IPv4
/// address), as (prefix, length). The well-known NAT64 prefix is not here: it is public
/// exactly when the IPv4 address it embeds is; IPv4-mapped addresses are checked as IPv4.
const NON_PUBLIC_V6: &[(u128, u32)] = &[
    (0, 96),                      // ::/96: unspecified, loopback, IPv4-compatible (deprecated)
    (0xffff_0000_0000_0000, 96),  // ::ffff:0:0:0/96 IPv4-translated
    (0x0064_ff9b_0001 << 80, 48), // 64:ff9b:1::/48 local-use NAT64
    (0x0100 << 112, 64),          // 100::/64 discard-only
    (0x0100_0000_0000_0001 << 64, 64), // 100:0:0:1::/64 dummy prefix
    (0x2001 << 112, 23), // 2001::/23 IETF protocol assignments: Teredo, benchmarking, ORCHID
    (0x2001_0db8 << 96, 32), // 2001:db8::/32 documentation
    (0x2002 << 112, 16), // 2002::/16 6to4: relays to whatever IPv4 address it embeds
    (0x3fff << 112, 20), // 3fff::/20 documentation
    (0x5f00 << 112, 16), // 5f00::/16 segment routing (SRv6) SIDs
    (0xfc00 << 112, 7),  // fc00::/7 unique local
    (0xfe80 << 112, 10), // fe80::/10 link-local
    (0xfec0 << 112, 10), // fec0::/10 site-local, deprecated
    (0xff00 << 112, 8),  // ff00::/8 multicast
];

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    // NAT64 (64:ff9b::/96) reaches the IPv4 address embedded in its last 32 bits.
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [.., high, low] = segments;
        return is_public_v4(Ipv4Addr::from(((high as u32) << 16) | low as u32));
    }
    let bits = u128::from(ip);
    let within = |&(prefix, len): &(u128, u32)| (bits ^ prefix) >> (128 - len) == 0;
    !NON_PUBLIC_V6.iter().any(within)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_pass() {
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2001:200::1",
            "2400:cb00::1",
            "2a00:1450:4001::1",
        ] {
            assert!(is_public(ip.parse().unwrap()), "{ip} is public");
        }
        let private = [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "198.18.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "::7f00:1",
            "2001:db8::1",
            "ff02::1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "64:ff9b:1::a00:1",
            "64:ff9b:1::808:808",
            "100::1",
            "100:0:0:1::1",
            "2001:2::1",
            "2001:10::1",
            "2001:1ff::1",
            "3fff::1",
            "3fff:fff::1",
            "5f00::1",
            "fec0::1",
            "::ffff:0:808:808",
            "192.88.99.1",
        ];
        for ip in private {
            assert!(!is_public(ip.parse().unwrap()), "{ip} is not public");
        }
    }

    #[test]
    fn urls_are_checked_by_scheme_and_literal_address() {
        let check = |url: &str, allow| check_url(&Url::parse(url).unwrap(), allow);
        assert!(check("https://cdn.example.com/a.png", false).is_ok());
        assert!(check("http://93.184.216.34/a.png", false).is_ok());
        assert!(check("http://127.0.0.1:8080/a.png", false).is_err());
        assert!(check("http://[::1]/a.png", false).is_err());
        // The URL parser normalizes the obfuscated forms to the address they denote.
        assert!(check("http://2130706433/a.png", false).is_err());
        assert!(check("http://0x7f.1/a.png", false).is_err());
        assert!(check("http://127.0.0.1:8080/a.png", true).is_ok());
        assert!(check("file:///etc/passwd", true).is_err());
        assert!(check("ftp://cdn.example.com/a.png", true).is_err());
    }
}
