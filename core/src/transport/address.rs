//! Which network addresses a relay may connect to as peers (protocol.md §6, facing the
//! internet): one definition for every host, which resolves a peer's name and checks each
//! address it would connect to against it (so DNS rebinding is caught where it connects).

use std::net::IpAddr;

/// Why an IPv4 address is refused as a peer, or `None` when it is public.
fn refused_v4(b: [u8; 4]) -> Option<&'static str> {
    let [a, c, ..] = b;
    match () {
        _ if a == 0 => Some("unspecified"),
        _ if a == 127 => Some("loopback"),
        _ if a == 10 || (a == 172 && c & 0xf0 == 16) || (a == 192 && c == 168) => Some("private"),
        _ if a == 169 && c == 254 => Some("link-local"),
        _ if a == 100 && c & 0xc0 == 64 => Some("shared (CGNAT)"),
        _ if (224..=239).contains(&a) => Some("multicast"),
        _ if a >= 240 => Some("reserved or broadcast"),
        _ => None,
    }
}

/// Why a relay must not connect to `ip` off `dev`, or `None` when it may: loopback, private
/// (10/8, 172.16/12, 192.168/16, fc00::/7, site-local fec0::/10), link-local (169.254/16,
/// fe80::/10), CGNAT (100.64/10), multicast (224/4, ff00::/8), unspecified (0/8, ::),
/// reserved and broadcast (240/4); the IPv4 address inside IPv4-mapped (::ffff:a.b.c.d),
/// IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::/96) and 6to4 (2002::/16) addresses is
/// judged as IPv4.
pub fn refused(ip: IpAddr) -> Option<&'static str> {
    let b = match ip {
        IpAddr::V4(v) => return refused_v4(v.octets()),
        IpAddr::V6(v) => v.octets(),
    };
    let zero = |from: usize, to: usize| b[from..to].iter().all(|x| *x == 0);
    let v4 = |at: usize| refused_v4([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    if zero(0, 16) {
        return Some("unspecified");
    }
    if zero(0, 15) && b[15] == 1 {
        return Some("loopback");
    }
    if zero(0, 10) && b[10] == 0xff && b[11] == 0xff {
        return v4(12);
    }
    if zero(0, 12) {
        return v4(12);
    }
    if b[..4] == [0x00, 0x64, 0xff, 0x9b] && zero(4, 12) {
        return v4(12);
    }
    if b[0] == 0x20 && b[1] == 0x02 {
        return v4(2);
    }
    match (b[0], b[1]) {
        (x, _) if x & 0xfe == 0xfc => Some("private"),
        (0xfe, y) if y & 0xc0 == 0x80 => Some("link-local"),
        (0xfe, y) if y & 0xc0 == 0xc0 => Some("private (site-local)"),
        (0xff, _) => Some("multicast"),
        _ => None,
    }
}

/// [`refused`] for an address written as text (an IPv6 zone such as `%eth0` is dropped);
/// text that is not an IP address is refused.
pub fn refused_text(ip: &str) -> Option<&'static str> {
    let bare = ip.split('%').next().unwrap_or(ip);
    match bare.parse::<IpAddr>() {
        Ok(ip) => refused(ip),
        Err(_) => Some("not an IP address"),
    }
}

/// Whether a relay on `network` checks every address a peer's name resolves to against
/// [`refused`]: off `dev`, unless `allow_private` (`--allow-private-peers`).
pub fn vetted(network: &str, allow_private: bool) -> bool {
    network != "dev" && !allow_private
}

/// Why a relay on `network` must not send to `url` at all, before any connection: a scheme
/// other than http or https; off `dev`, a scheme other than https; and, unless
/// `allow_private` (`--allow-private-peers`), a host written as an IP address that
/// [`refused`] refuses. A host that is a name is judged when the host resolves it, address
/// by address. The reason names the URL's origin.
pub fn refused_url(url: &str, network: &str, allow_private: bool) -> Option<String> {
    let (scheme, rest) = match url.split_once("://") {
        Some((s @ ("http" | "https"), rest)) => (s, rest),
        _ => return Some(format!("{url}: not an http or https URL")),
    };
    if network == "dev" {
        return None;
    }
    // Called for every outbound exchange: the origin is spelled only for a refusal.
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let origin = || format!("{scheme}://{authority}");
    if scheme != "https" {
        return Some(format!(
            "{}: relays off the dev network are reached over https only",
            origin()
        ));
    }
    if allow_private {
        return None;
    }
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host_port.split(':').next().unwrap_or(""),
    };
    let bare = host.split("%25").next().unwrap_or(host);
    let ip: IpAddr = match bare.parse() {
        Ok(ip) => ip,
        Err(_) => match url_ipv4(bare)? {
            Some(v4) => IpAddr::V4(v4),
            None => return Some(format!("{}: {host} is not a valid IPv4 address", origin())),
        },
    };
    refused(ip).map(|why| {
        format!(
            "{}: {host} is {why} (--allow-private-peers lifts the address check)",
            origin()
        )
    })
}

/// A URL host that a URL parser reads as an IPv4 address in one of its legacy forms (`127.1`,
/// `0x7f.0.0.1`, `0177.0.0.1`, `2130706433`): the WHATWG URL standard's IPv4 parser, which
/// is what the JS hosts' `URL` applies before connecting. `None` when the host is a name;
/// `Some(None)` when it ends in a number but is no valid address (a URL parser refuses it).
fn url_ipv4(host: &str) -> Option<Option<std::net::Ipv4Addr>> {
    let mut parts: Vec<&str> = host.split('.').collect();
    if parts.len() > 1 && parts.last() == Some(&"") {
        parts.pop();
    }
    let number = |p: &str| -> Option<u64> {
        let (digits, radix) = match p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
            Some(h) => (h, 16),
            None if p.len() > 1 && p.starts_with('0') => (&p[1..], 8),
            None => (p, 10),
        };
        if digits.is_empty() {
            return (radix != 10).then_some(0);
        }
        if digits.len() > 12 || !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        u64::from_str_radix(digits, radix).ok()
    };
    let last = *parts.last()?;
    let ends_in_number =
        (!last.is_empty() && last.bytes().all(|b| b.is_ascii_digit())) || number(last).is_some();
    if !ends_in_number {
        return None;
    }
    if parts.len() > 4 {
        return Some(None);
    }
    let Some(numbers) = parts
        .iter()
        .map(|p| number(p))
        .collect::<Option<Vec<u64>>>()
    else {
        return Some(None);
    };
    let (init, tail) = numbers.split_at(numbers.len() - 1);
    if init.iter().any(|n| *n > 255) || tail[0] >= 1u64 << (8 * (5 - numbers.len())) {
        return Some(None);
    }
    let mut v = tail[0];
    for (i, n) in init.iter().enumerate() {
        v += n << (8 * (3 - i));
    }
    Some(Some(std::net::Ipv4Addr::from(v as u32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_refused_for_their_scheme_off_dev_and_for_a_private_ip_host_unless_allowed() {
        let off = |u: &str| refused_url(u, "prod", false);
        assert_eq!(
            off("http://relay.example/relay/v1/message.deliver").as_deref(),
            Some("http://relay.example: relays off the dev network are reached over https only")
        );
        assert_eq!(
            off("https://127.0.0.1:8443/relay/v1/message.deliver").as_deref(),
            Some("https://127.0.0.1:8443: 127.0.0.1 is loopback (--allow-private-peers lifts the address check)")
        );
        assert_eq!(
            off("https://[::ffff:10.0.0.1]/.well-known/relay").as_deref(),
            Some("https://[::ffff:10.0.0.1]: ::ffff:10.0.0.1 is private (--allow-private-peers lifts the address check)")
        );
        assert!(
            off("https://[fe80::1%25eth0]:443/x").is_some(),
            "a zoned link-local"
        );
        assert!(off("https://user@10.1.2.3/x").is_some(), "behind userinfo");
        assert_eq!(
            off("https://relay.example/relay/v1/route.get"),
            None,
            "a name: judged when resolved"
        );
        assert_eq!(off("https://8.8.8.8/x"), None);
        assert_eq!(off("https://[2606:4700:4700::1111]:8443/x"), None);
        assert!(off("ftp://relay.example/").is_some());
        assert!(off("relay.example").is_some());
        // --allow-private-peers lifts the address check, not the scheme's.
        assert_eq!(refused_url("https://127.0.0.1/x", "prod", true), None);
        assert!(refused_url("http://127.0.0.1/x", "prod", true).is_some());
        // On dev anything http(s) goes.
        assert_eq!(refused_url("http://127.0.0.1:9/x", "dev", false), None);
        assert!(refused_url("gopher://127.0.0.1/", "dev", false).is_some());
    }

    #[test]
    fn only_public_addresses_pass_in_every_form() {
        let private = [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.0.9",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "224.0.0.1",
            "239.255.255.255",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
        ];
        for a in private {
            let ip: IpAddr = a.parse().unwrap();
            assert!(refused(ip).is_some(), "{a} passed");
        }
        let public = [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.1",
            "172.15.255.255",
            "172.32.0.1",
            "192.167.1.1",
            "169.253.1.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ];
        for a in public {
            let ip: IpAddr = a.parse().unwrap();
            assert_eq!(refused(ip), None, "{a} refused");
        }
    }

    #[test]
    fn text_forms_are_judged_as_their_address_and_anything_else_is_refused() {
        assert_eq!(refused_text("::ffff:127.0.0.1"), Some("loopback"));
        assert_eq!(refused_text("fe80::1%eth0"), Some("link-local"));
        assert_eq!(refused_text("8.8.8.8"), None);
        assert_eq!(refused_text("example.com"), Some("not an IP address"));
        assert_eq!(refused_text("1.2.3"), Some("not an IP address"));
    }
}
