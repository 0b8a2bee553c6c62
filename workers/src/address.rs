//! Keel's address policy: which addresses are public. Everything the worker reaches on a
//! tenant's behalf (vendor calls, media downloads, the agent's HTTP, the runs' egress
//! proxy) goes only to public addresses unless the deployment says otherwise; loopback,
//! private, link-local (the cloud metadata service at 169.254.169.254 among them), CGNAT,
//! unique-local and the rest of IANA's special-purpose ranges are not public.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub(crate) fn is_public(ip: IpAddr) -> bool {
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
}
