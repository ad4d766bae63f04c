//! Which `Host` values name this Ferry: DNS-rebinding protection. A page
//! can point its own domain name at Ferry's address; the browser then
//! treats Ferry as part of that page's site and lets it read the answers,
//! but still sends the page's name as `Host`. Loopback names and addresses
//! (any port) are this machine's; any other name must be one Ferry was
//! told is its own. `/mcp` and the native API share this rule.

use super::origin::is_loopback_host;

/// Whether a `Host` name (IPv6 literals in brackets) is this machine.
fn is_loopback(name: &str) -> bool {
    url::Host::parse(name).is_ok_and(|host| is_loopback_host(&host))
}

/// The host part of `host[:port]` (IPv6 literals keep their brackets), or
/// `None` when what follows the host is not a port (`localhost:evil.com`).
fn host_name(authority: &str) -> Option<&str> {
    let (name, rest) = if authority.starts_with('[') {
        // Up to the closing bracket; without one, the value is malformed.
        authority.split_at(authority.find(']')? + 1)
    } else {
        authority.split_at(authority.find(':').unwrap_or(authority.len()))
    };
    let port_ok = match rest.strip_prefix(':') {
        Some(port) => port.bytes().all(|b| b.is_ascii_digit()),
        None => rest.is_empty(),
    };
    port_ok.then_some(name)
}

/// Whether `host` (a `Host` header's value) names this Ferry: a loopback
/// name or address on any port, or one of `extra` (`name`, any port, or
/// `name:port`).
pub(crate) fn allowed(extra: &[String], host: &str) -> bool {
    let Some(name) = host_name(host) else {
        return false;
    };
    is_loopback(name)
        || extra
            .iter()
            .any(|a| a.eq_ignore_ascii_case(host) || a.eq_ignore_ascii_case(name))
}
