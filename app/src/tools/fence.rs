//! Where tools may connect: a [`Fence`] decides on every address a tool's
//! request resolves to, inside the HTTP client's resolver — after the name
//! lookup and before any connection, for the first request and every
//! redirect alike (a check of the URL alone would miss a redirect to
//! 169.254.169.254, or a name that resolves elsewhere the second time).
//!
//! Rules, in order:
//! 1. The daemon's own API address (`[api] listen`) is always refused: a
//!    prompt must never drive the daemon that runs it.
//! 2. With a non-empty `allow_hosts`, an `http_get` host that is not listed
//!    is refused.
//! 3. Loopback, link-local (169.254/16, fe80::/10), private (10/8,
//!    172.16/12, 192.168/16, fc00::/7), shared (100.64/10), unspecified,
//!    broadcast and multicast addresses — and IPv6 addresses that carry
//!    one of those IPv4 addresses (mapped, compatible, translated, NAT64,
//!    6to4), and NAT64's local-use prefix — are refused unless the host is
//!    listed. An `http` tool's own configured URL host counts as listed
//!    (the operator wrote it; those tools follow no redirect).
//!
//! Invariant: a refused request opens no connection — the refusal is the
//! resolver's answer, and fenced clients use no proxy (a proxy would make
//! the resolver see the proxy, not the target).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// The rules of one tool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fence {
    /// Hosts (names or IP literals, lower case) let through rule 3.
    allow_hosts: Vec<String>,
    /// Rule 2 applies.
    only_listed: bool,
    /// Rule 1.
    daemon: Option<SocketAddr>,
}

impl Fence {
    /// For `http_get`: `allow_hosts`, if not empty, is the whole list.
    pub fn for_http_get(allow_hosts: &[String], daemon: Option<SocketAddr>) -> Fence {
        Fence {
            allow_hosts: allow_hosts.iter().map(|h| normalize(h)).collect(),
            only_listed: !allow_hosts.is_empty(),
            daemon,
        }
    }

    /// For an `http` tool at `url`: its host and `allow_hosts` are listed.
    pub fn for_endpoint(url: &str, allow_hosts: &[String], daemon: Option<SocketAddr>) -> Fence {
        let mut hosts: Vec<String> = allow_hosts.iter().map(|h| normalize(h)).collect();
        if let Some(host) = url.parse::<Uri>().ok().and_then(|u| u.host().map(normalize)) {
            hosts.push(host);
        }
        Fence {
            allow_hosts: hosts,
            only_listed: false,
            daemon,
        }
    }

    fn listed(&self, host: &str) -> bool {
        let host = normalize(host);
        self.allow_hosts.contains(&host)
    }

    /// Rule 2, on the name alone (before it is looked up).
    pub fn admit_host(&self, host: &str) -> Result<(), String> {
        if self.only_listed && !self.listed(host) {
            return Err(format!(
                "refused by the tool fence: {host} is not in the tool's allow_hosts"
            ));
        }
        Ok(())
    }

    /// Whether `host` resolving to `addr` may be connected to; the reason
    /// if not.
    pub fn admit(&self, host: &str, addr: SocketAddr) -> Result<(), String> {
        self.admit_host(host)?;
        if let Some(daemon) = self.daemon {
            if is_daemon(daemon, addr) {
                return Err(format!(
                    "refused by the tool fence: {host} ({addr}) is this daemon's own API"
                ));
            }
        }
        if !self.listed(host) && is_internal(addr.ip()) {
            return Err(format!(
                "refused by the tool fence: {host} is {}, a loopback, link-local or private address; list it in the tool's allow_hosts to permit it",
                addr.ip()
            ));
        }
        Ok(())
    }
}

/// Lower case, no IPv6 brackets, no trailing dot.
fn normalize(host: &str) -> String {
    host.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// Whether `addr` reaches the API listening on `daemon`. Loopback
/// addresses all reach a loopback listener, and an unspecified one listens
/// on every address of the host, so the port decides there.
fn is_daemon(daemon: SocketAddr, addr: SocketAddr) -> bool {
    if daemon.port() != addr.port() {
        return false;
    }
    let (d, a) = (daemon.ip(), canonical(addr.ip()));
    d == a || d.is_unspecified() || (d.is_loopback() && a.is_loopback()) || a.is_unspecified()
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Addresses a tool must not reach unless listed.
pub fn is_internal(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => is_internal_v4(v4),
        IpAddr::V6(v6) => is_internal_v6(v6),
    }
}

fn is_internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
}

fn is_internal_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xfe00) == 0xfc00
        // NAT64's local-use prefix (64:ff9b:1::/48, RFC 8215): a
        // translator of the operator's own, in front of its own network.
        || s[..3] == [0x64, 0xff9b, 1]
        || embedded_v4(ip).is_some_and(is_internal_v4)
}

/// The IPv4 address an IPv6 address carries and may reach through a
/// host's stack or a translator on the path: IPv4-compatible (`::a.b.c.d`,
/// deprecated but still routed by some stacks), IPv4-translated
/// (`::ffff:0:a.b.c.d`, RFC 2765), NAT64's well-known prefix
/// (`64:ff9b::a.b.c.d`, RFC 6052) and 6to4 (`2002:AABB:CCDD::/48`,
/// RFC 3056). (IPv4-mapped addresses are [`canonical`]'s.) Found by a
/// review: `64:ff9b::127.0.0.1` and the others were let through.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        [0, 0, 0, 0, 0, 0, hi, lo] => Some(low(hi, lo)),
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => Some(low(hi, lo)),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(low(hi, lo)),
        [0x2002, hi, lo, ..] => Some(low(hi, lo)),
        _ => None,
    }
}

/// A resolver that lets through only what the fence admits: every address
/// the name resolves to must be admitted (one refused address refuses the
/// request: a name that mixes public and internal addresses is suspect).
#[derive(Debug)]
pub struct FencedResolver {
    fence: Arc<Fence>,
    inner: DefaultResolver,
}

impl FencedResolver {
    pub fn new(fence: Arc<Fence>) -> FencedResolver {
        FencedResolver {
            fence,
            inner: DefaultResolver::default(),
        }
    }
}

impl Resolver for FencedResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let host = uri.host().unwrap_or("");
        let refuse =
            |reason: String| ureq::Error::Io(io::Error::new(io::ErrorKind::PermissionDenied, reason));
        self.fence.admit_host(host).map_err(refuse)?;
        let addrs = self.inner.resolve(uri, config, timeout)?;
        for addr in addrs.iter() {
            if let Err(reason) = self.fence.admit(host, *addr) {
                tracing::warn!(host, %addr, "tool request refused by the fence");
                return Err(refuse(reason));
            }
        }
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn internal_addresses_are_refused_unless_listed() {
        let fence = Fence::for_http_get(&[], Some(at("127.0.0.1:7341")));
        for addr in [
            "127.0.0.1:80",
            "169.254.169.254:80",
            "10.1.2.3:80",
            "192.168.0.1:80",
            "[::1]:80",
            "[fe80::1]:80",
            "[fd00::1]:80",
            "[::ffff:169.254.169.254]:80",
            "0.0.0.0:80",
            "100.64.0.1:80",
            // IPv4 inside IPv6 (no connection is made: `admit` only judges).
            "[::127.0.0.1]:80",
            "[::ffff:0:127.0.0.1]:80",
            "[64:ff9b::127.0.0.1]:80",
            "[64:ff9b::a9fe:a9fe]:80",
            "[64:ff9b::10.0.0.1]:80",
            "[64:ff9b:1::5]:80",
            "[2002:7f00:1::1]:80",
            "[2002:c0a8:1::1]:80",
        ] {
            assert!(fence.admit("h", at(addr)).is_err(), "{addr} admitted");
        }
        assert!(fence.admit("example.com", at("93.184.215.14:443")).is_ok());
        // The same forms around a public address are ordinary addresses.
        for addr in [
            "[64:ff9b::5db8:d70e]:443",
            "[2002:5db8:d70e::1]:443",
            "[2606:2800:21f::1]:443",
        ] {
            assert!(fence.admit("example.com", at(addr)).is_ok(), "{addr} refused");
        }
        let listed = Fence::for_http_get(&["LocalHost".into()], None);
        assert!(listed.admit("localhost", at("127.0.0.1:8080")).is_ok());
        assert!(
            listed.admit("example.com", at("93.184.215.14:443")).is_err(),
            "only listed hosts"
        );
    }

    #[test]
    fn the_daemon_is_refused_even_when_listed() {
        let fence = Fence::for_endpoint("http://127.0.0.1:7341/agents", &[], Some(at("127.0.0.1:7341")));
        let e = fence.admit("127.0.0.1", at("127.0.0.1:7341")).unwrap_err();
        assert!(e.contains("own API"), "{e}");
        assert!(fence.admit("localhost", at("[::1]:7341")).is_err());
        assert!(
            fence.admit("127.0.0.1", at("127.0.0.1:7342")).is_ok(),
            "its own URL host is listed"
        );
        let exposed = Fence::for_http_get(&["10.0.0.5".into()], Some(at("0.0.0.0:7341")));
        assert!(exposed.admit("10.0.0.5", at("10.0.0.5:7341")).is_err());
    }
}
