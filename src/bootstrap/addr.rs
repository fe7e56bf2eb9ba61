//! Which local address to listen on, and who we are (host identity).
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs, UdpSocket};

/// Picks the address rustccl listens on:
/// 1. the first address of interface `ifname` (`RUSTCCL_SOCKET_IFNAME`);
/// 2. else, the local address that routes to `hint` (the torch store's host
///    or `MASTER_ADDR`); a loopback hint gives a loopback address;
/// 3. else, the address this host's name resolves to, or 127.0.0.1.
///
/// Never the wildcard address: nothing listens on all interfaces.
pub fn listen_ip(ifname: Option<&str>, hint: Option<&str>) -> Result<IpAddr, String> {
    if let Some(name) = ifname {
        let addrs = if_addrs::get_if_addrs().map_err(|e| format!("cannot list interfaces: {e}"))?;
        let mut mine: Vec<IpAddr> = addrs.iter().filter(|a| a.name == name).map(|a| a.ip()).collect();
        mine.sort_by_key(|ip| ip.is_ipv6()); // prefer IPv4
        return mine.first().copied().ok_or_else(|| format!("RUSTCCL_SOCKET_IFNAME={name}: no such interface with an address"));
    }
    if let Some(host) = hint.filter(|h| !h.is_empty()) {
        if let Some(ip) = resolve(host) {
            if ip.is_loopback() {
                return Ok(ip);
            }
            if let Some(local) = route_to(ip) {
                return Ok(local);
            }
        }
    }
    let name = hostname();
    Ok(resolve(&name).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

fn resolve(host: &str) -> Option<IpAddr> {
    let mut addrs: Vec<IpAddr> = (host, 0).to_socket_addrs().ok()?.map(|a| a.ip()).collect();
    addrs.sort_by_key(|ip| ip.is_ipv6());
    addrs.first().copied()
}

/// The local address the kernel would use to reach `ip` (no packet is sent:
/// connecting a UDP socket only chooses a route).
fn route_to(ip: IpAddr) -> Option<IpAddr> {
    let bind = if ip.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let sock = UdpSocket::bind(bind).ok()?;
    sock.connect((ip, 9)).ok()?;
    Some(sock.local_addr().ok()?.ip())
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "localhost".into())
}

/// Identifies "the same host" for shared memory: the same kernel (boot id)
/// and the same network namespace, so that simulated hosts in separate
/// namespaces count as different hosts. `RUSTCCL_HOST_ID` overrides it.
pub fn host_identity() -> String {
    if let Some(id) = &crate::config::Config::get().host_id {
        return id.clone();
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net").map(|p| p.display().to_string()).unwrap_or_default();
    format!("{}/{}/{}", hostname(), boot.trim(), netns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hint_gives_loopback() {
        assert_eq!(listen_ip(None, Some("127.0.0.1")).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(listen_ip(None, Some("localhost")).unwrap().is_loopback());
    }

    #[test]
    fn unknown_interface_is_an_error() {
        let e = listen_ip(Some("no-such-if0"), None).unwrap_err();
        assert!(e.contains("no-such-if0"));
    }

    #[test]
    fn host_identity_is_stable() {
        assert_eq!(host_identity(), host_identity());
    }
}
