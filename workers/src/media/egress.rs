//! Where the worker's outbound HTTP may go, and how its failures read. Vendor calls, media
//! downloads and the agent's HTTP reach only http(s) and (unless the limits allow it) only
//! public addresses, checked on every connection and every redirect; [`refusal`] finds the
//! filter's [`Refused`] in a reqwest error, and [`describe`] spells out the error's causes.

use std::error::Error;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::{ClientBuilder, redirect};
use url::{Host, Url};

use crate::address::is_public;

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

#[cfg(test)]
mod tests {
    use super::*;

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
