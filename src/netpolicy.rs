//! Which executor addresses the admin accepts and calls: the registration policy that keeps
//! `/api/registry` from being a way to make the admin post job parameters and the access token
//! to any host (server-side request forgery).
//!
//! An address is a base URL and nothing else: `http(s)://host[:port]`, with at most a trailing
//! `/` (XXL-JOB executors register `http://ip:port/`), and no path, query, fragment or userinfo.
//! Its host must be allowed by the policy, a list of entries given by `--executor-allow`:
//! - a CIDR (`10.0.0.0/8`, `fd12::/16`) or a bare IP allows IP literals inside it;
//! - a host pattern (`exec-1.internal`, `*.jobs.internal` for any name below it, `*` for any
//!   name) allows names; a name must also resolve, when the admin sends to it, only to
//!   addresses the CIDR entries allow. The client resolves the name once per connection and
//!   connects only to the addresses it checked, so a DNS answer that changes between the check
//!   and the connection (rebinding) cannot take it elsewhere.
//!
//! Some ranges are denied even when a broader CIDR covers them: link-local (`169.254.0.0/16`,
//! `fe80::/10`, home of the cloud metadata services), the other metadata addresses
//! (`fd00:ec2::254`, `100.100.100.200`), NAT64 forms of link-local, and the unspecified
//! addresses. Only a CIDR entry that lies inside such a range (say `169.254.10.0/24`) opens it.
//! IPv4-mapped IPv6 addresses are judged as the IPv4 address they carry.
//!
//! A pull executor's address (`pull://{name}`, [`check_pull_address`]) names no host: the admin
//! never connects to it, the executor comes for its calls. The policy does not apply to it.
//!
//! This module is pure: it parses and decides, and never resolves or connects (the protocol
//! client does that, asking [`AddressPolicy::allows_ip`] about each resolved address).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

/// How a pull executor's address begins.
pub const PULL_SCHEME: &str = "pull://";

/// The longest name after [`PULL_SCHEME`].
pub const MAX_PULL_NAME: usize = 128;

/// Whether `address` is a pull executor's (whatever follows the scheme).
pub fn is_pull_address(address: &str) -> bool {
    address.starts_with(PULL_SCHEME)
}

/// Refuses a pull executor's address whose name is empty, longer than [`MAX_PULL_NAME`], or has
/// a character other than ASCII letters, digits, `.`, `_` and `-`.
pub fn check_pull_address(address: &str) -> Result<(), String> {
    let Some(name) = address.strip_prefix(PULL_SCHEME) else {
        return Err(format!("`{}` is not a pull address", shown(address)));
    };
    if name.is_empty() || name.len() > MAX_PULL_NAME {
        return Err(format!(
            "`{}`: a pull address names 1 to {MAX_PULL_NAME} characters",
            shown(address)
        ));
    }
    if let Some(bad) =
        name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "`{}`: a pull address's name is letters, digits, `.`, `_` and `-` (found `{}`)",
            shown(address),
            bad.escape_default()
        ));
    }
    Ok(())
}

/// The default allow-list: loopback, the private ranges, and the name `localhost`.
pub const DEFAULT_ALLOW: &str =
    "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7,localhost";

/// Ranges no address may fall in unless an entry inside the range allows it.
const DENIED: &[&str] = &[
    "169.254.0.0/16",
    "fe80::/10",
    "fd00:ec2::254/128",
    "100.100.100.200/32",
    "64:ff9b::a9fe:0/112",
    "0.0.0.0/8",
    "::/128",
];

/// [`DENIED`], read once.
static DENIED_CIDRS: LazyLock<Vec<Cidr>> =
    LazyLock::new(|| DENIED.iter().filter_map(|range| Cidr::parse(range).ok()).collect());

/// A block of IP addresses: a network and the length of its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Reads `a.b.c.d/n`, `x::y/n`, or a bare address (a block of one).
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (ip, prefix) = match text.split_once('/') {
            Some((ip, prefix)) => (ip, Some(prefix)),
            None => (text, None),
        };
        let ip: IpAddr =
            ip.parse().map_err(|_| format!("`{text}` is not an IP address or CIDR"))?;
        let ip = ip.to_canonical();
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(prefix) => match prefix.parse::<u8>() {
                Ok(prefix) if prefix <= bits => prefix,
                _ => return Err(format!("`{text}`: the prefix length must be 0 to {bits}")),
            },
        };
        Ok(Cidr { network: mask(ip, prefix), prefix })
    }

    /// Whether `ip` lies in this block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.network.is_ipv4() && mask(ip, self.prefix) == self.network
    }

    /// Whether all of `other` lies in this block.
    fn covers(&self, other: &Cidr) -> bool {
        other.prefix >= self.prefix && self.contains(other.network)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((bits & kept).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((bits & kept).into())
        }
    }
}

/// A pattern of host names: one name, every name below a domain (`*.domain`), or any (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    Below(String),
    Any,
}

impl HostPattern {
    fn parse(text: &str) -> Result<HostPattern, String> {
        let lower = text.to_ascii_lowercase();
        if lower == "*" {
            return Ok(HostPattern::Any);
        }
        let (below, name) = match lower.strip_prefix("*.") {
            Some(name) => (true, name),
            None => (false, lower.as_str()),
        };
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && !label.starts_with('-')
                    && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !valid {
            return Err(format!(
                "`{text}` is neither a CIDR nor a host pattern (`name`, `*.domain` or `*`)"
            ));
        }
        Ok(if below {
            HostPattern::Below(name.to_owned())
        } else {
            HostPattern::Exact(name.to_owned())
        })
    }

    fn matches(&self, name: &str) -> bool {
        match self {
            HostPattern::Any => true,
            HostPattern::Exact(exact) => name == exact,
            HostPattern::Below(domain) => {
                name.strip_suffix(domain.as_str()).is_some_and(|head| head.ends_with('.'))
            }
        }
    }
}

/// The host of an accepted address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// An IP literal, already checked.
    Ip(IpAddr),
    /// A name that matched a pattern; what it resolves to is checked when it is called.
    Name(String),
}

/// The executor addresses an admin accepts at registration and calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressPolicy {
    cidrs: Vec<Cidr>,
    hosts: Vec<HostPattern>,
}

impl Default for AddressPolicy {
    fn default() -> Self {
        let entries: Vec<&str> = DEFAULT_ALLOW.split(',').collect();
        AddressPolicy::parse(&entries)
            .unwrap_or(AddressPolicy { cidrs: Vec::new(), hosts: Vec::new() })
    }
}

impl AddressPolicy {
    /// Reads the entries of `--executor-allow`: CIDRs, bare IPs and host patterns.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AddressPolicy, String> {
        let mut policy = AddressPolicy { cidrs: Vec::new(), hosts: Vec::new() };
        for entry in entries {
            let entry = entry.as_ref().trim();
            if entry.is_empty() {
                continue;
            }
            let looks_like_ip =
                entry.contains(':') || entry.contains('/') || entry.parse::<IpAddr>().is_ok();
            if looks_like_ip {
                policy.cidrs.push(Cidr::parse(entry)?);
            } else {
                policy.hosts.push(HostPattern::parse(entry)?);
            }
        }
        if policy.cidrs.is_empty() {
            return Err("the executor allow-list needs at least one CIDR".to_owned());
        }
        Ok(policy)
    }

    /// Whether the admin may connect to `ip`.
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let mut allowing = self.cidrs.iter().filter(|cidr| cidr.contains(ip));
        let denied = DENIED_CIDRS.iter().find(|range| range.contains(ip));
        match denied {
            None => allowing.next().is_some(),
            Some(range) => allowing.any(|cidr| range.covers(cidr)),
        }
    }

    /// Checks an executor address (its shape, then its host); the reason when it is refused.
    pub fn check_address(&self, address: &str) -> Result<Host, String> {
        let host = address_host(address)?;
        match &host {
            Host::Ip(ip) if !self.allows_ip(*ip) => {
                Err(format!("`{}`: {ip} is not in the executor allow-list", shown(address)))
            }
            Host::Name(name) if !self.hosts.iter().any(|pattern| pattern.matches(name)) => {
                Err(format!(
                    "`{}`: the host `{name}` is not in the executor allow-list",
                    shown(address)
                ))
            }
            _ => Ok(host),
        }
    }
}

/// The host of `address` if it is a bare `http(s)://host[:port][/]` base URL.
pub fn address_host(address: &str) -> Result<Host, String> {
    // Every send checks its address: the common spelling is read without the URL parser.
    let rest = address.strip_prefix("http://").or_else(|| address.strip_prefix("https://"));
    match rest.and_then(|rest| plain_ip(rest.strip_suffix('/').unwrap_or(rest))) {
        Some(ip) => Ok(Host::Ip(ip)),
        None => parsed_host(address),
    }
}

/// The IP of a plain `a.b.c.d[:port]` or `[v6][:port]` (a port of digits that fits), as the URL
/// parser reads it; `None` for any other authority, left to [`parsed_host`].
fn plain_ip(authority: &str) -> Option<IpAddr> {
    let (ip, port) = match authority.strip_prefix('[') {
        Some(rest) => {
            let (v6, after) = rest.split_once(']')?;
            let port = if after.is_empty() { None } else { Some(after.strip_prefix(':')?) };
            (IpAddr::V6(v6.parse::<Ipv6Addr>().ok()?), port)
        }
        None => {
            let (v4, port) = match authority.split_once(':') {
                Some((v4, port)) => (v4, Some(port)),
                None => (authority, None),
            };
            (IpAddr::V4(v4.parse::<Ipv4Addr>().ok()?), port)
        }
    };
    let port_fits = |port: &str| {
        !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok()
    };
    port.is_none_or(port_fits).then_some(ip)
}

/// [`address_host`] through the URL parser: every shape check, and the host however spelled.
fn parsed_host(address: &str) -> Result<Host, String> {
    let shown = shown(address);
    let Some((scheme, rest)) = address.split_once("://") else {
        return Err(format!("`{shown}` is not an http(s) URL"));
    };
    if !matches!(scheme, "http" | "https") {
        return Err(format!("`{shown}`: only http and https are accepted"));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains('@') {
        return Err(format!("`{shown}`: an address carries no user or password"));
    }
    if let Some(extra) = authority.chars().find(|c| matches!(c, '/' | '?' | '#' | '\\')) {
        return Err(format!(
            "`{shown}`: an address is scheme, host and port only (found `{extra}`)"
        ));
    }
    if authority.is_empty()
        || authority.chars().any(|c| c.is_whitespace() || c.is_control() || c == '%')
    {
        return Err(format!("`{shown}`: the host is empty or has characters a host cannot have"));
    }
    let url = url::Url::parse(address).map_err(|error| format!("`{shown}`: {error}"))?;
    match url.host() {
        Some(url::Host::Ipv4(ip)) => Ok(Host::Ip(IpAddr::V4(ip))),
        Some(url::Host::Ipv6(ip)) => Ok(Host::Ip(IpAddr::V6(ip))),
        Some(url::Host::Domain(name)) => {
            Ok(Host::Name(name.trim_end_matches('.').to_ascii_lowercase()))
        }
        None => Err(format!("`{shown}` has no host")),
    }
}

/// An address as it may appear in a message: its first 100 characters, controls dropped.
fn shown(address: &str) -> String {
    address.chars().take(100).filter(|c| !c.is_control()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_addresses_name_a_plain_name() {
        let long = format!("pull://{}", "a".repeat(MAX_PULL_NAME + 1));
        let cases: &[(&str, Result<(), &str>)] = &[
            ("pull://host-1.a_b", Ok(())),
            ("pull://", Err("1 to 128 characters")),
            (&long, Err("1 to 128 characters")),
            ("pull://a/b", Err("found `/`")),
            ("pull://a b", Err("found ` `")),
            ("pull://a\nb", Err("found `\\n`")),
            ("http://127.0.0.1:1", Err("is not a pull address")),
        ];
        for (address, expected) in cases {
            match (check_pull_address(address), expected) {
                (Ok(()), Ok(())) => {}
                (Err(reason), Err(part)) => assert!(reason.contains(part), "{address}: {reason}"),
                (got, _) => panic!("{address}: {got:?}, expected {expected:?}"),
            }
        }
        assert!(is_pull_address("pull://x") && !is_pull_address("https://x"));
    }

    fn check(policy: &AddressPolicy, address: &str) -> String {
        match policy.check_address(address) {
            Ok(Host::Ip(ip)) => format!("ok {ip}"),
            Ok(Host::Name(name)) => format!("ok name {name}"),
            Err(reason) => reason,
        }
    }

    #[test]
    fn the_plain_reading_agrees_with_the_url_parser() {
        let table = [
            ("http://127.0.0.1:9999", Some("127.0.0.1")),
            ("https://10.1.2.3:9999/", Some("10.1.2.3")),
            ("http://192.168.0.7", Some("192.168.0.7")),
            ("http://1.2.3.4:0080/", Some("1.2.3.4")),
            ("http://1.2.3.4:65535/", Some("1.2.3.4")),
            ("http://[::1]:9999/", Some("::1")),
            ("http://[fd12:3456::1]", Some("fd12:3456::1")),
            ("http://[::ffff:127.0.0.1]:9999/", Some("::ffff:127.0.0.1")),
            // Left to the URL parser: other spellings, names, odd ports.
            ("http://2130706433:9999/", None),
            ("http://0x7f.1:9999/", None),
            ("http://010.0.0.1/", None),
            ("http://1.2.3.4.:80/", None),
            ("http://1.2.3.4:/", None),
            ("http://1.2.3.4:65536/", None),
            ("http://1.2.3.4:+80/", None),
            ("http://[::1]x/", None),
            ("http://localhost:9999/", None),
        ];
        for (address, plain) in table {
            let authority = address.split_once("://").map(|(_, rest)| rest).unwrap_or_default();
            let authority = authority.strip_suffix('/').unwrap_or(authority);
            let read = plain_ip(authority);
            assert_eq!(read.map(|ip| ip.to_string()).as_deref(), plain, "{address}");
            if let Some(ip) = read {
                assert_eq!(parsed_host(address), Ok(Host::Ip(ip)), "{address}");
            }
            assert_eq!(address_host(address), parsed_host(address), "{address}");
        }
    }

    #[test]
    fn the_default_policy() {
        let policy = AddressPolicy::default();
        let table = [
            ("http://127.0.0.1:9999", "ok 127.0.0.1"),
            ("http://127.0.0.1:9999/", "ok 127.0.0.1"),
            ("https://10.1.2.3:9999/", "ok 10.1.2.3"),
            ("http://172.31.255.255:1", "ok 172.31.255.255"),
            ("http://192.168.0.7", "ok 192.168.0.7"),
            ("http://[::1]:9999/", "ok ::1"),
            ("http://[fd12:3456::1]:9999", "ok fd12:3456::1"),
            ("http://localhost:9999/", "ok name localhost"),
            ("http://LOCALHOST.:9999/", "ok name localhost"),
            // What the client would connect to, however it is spelled.
            ("http://2130706433:9999/", "ok 127.0.0.1"),
            ("http://0x7f.1:9999/", "ok 127.0.0.1"),
            ("http://[::ffff:127.0.0.1]:9999/", "ok ::ffff:127.0.0.1"),
            // Never by default: metadata, link-local, public, unspecified.
            (
                "http://169.254.169.254/",
                "`http://169.254.169.254/`: 169.254.169.254 is not in the executor allow-list",
            ),
            (
                "http://[::ffff:169.254.169.254]/",
                "`http://[::ffff:169.254.169.254]/`: ::ffff:169.254.169.254 is not in the executor allow-list",
            ),
            (
                "http://[fe80::1]:9999/",
                "`http://[fe80::1]:9999/`: fe80::1 is not in the executor allow-list",
            ),
            (
                "http://[fd00:ec2::254]/",
                "`http://[fd00:ec2::254]/`: fd00:ec2::254 is not in the executor allow-list",
            ),
            (
                "http://0.0.0.0:9999/",
                "`http://0.0.0.0:9999/`: 0.0.0.0 is not in the executor allow-list",
            ),
            ("http://8.8.8.8/", "`http://8.8.8.8/`: 8.8.8.8 is not in the executor allow-list"),
            (
                "http://172.32.0.1/",
                "`http://172.32.0.1/`: 172.32.0.1 is not in the executor allow-list",
            ),
            (
                "http://metadata.google.internal/",
                "`http://metadata.google.internal/`: the host `metadata.google.internal` is not in the executor allow-list",
            ),
            (
                "http://localhost.evil.example/",
                "`http://localhost.evil.example/`: the host `localhost.evil.example` is not in the executor allow-list",
            ),
            // Not an address: path, query, fragment, userinfo, other schemes.
            (
                "http://127.0.0.1:9999/run",
                "`http://127.0.0.1:9999/run`: an address is scheme, host and port only (found `/`)",
            ),
            (
                "http://127.0.0.1:9999//",
                "`http://127.0.0.1:9999//`: an address is scheme, host and port only (found `/`)",
            ),
            (
                "http://127.0.0.1:9999?x=1",
                "`http://127.0.0.1:9999?x=1`: an address is scheme, host and port only (found `?`)",
            ),
            (
                "http://127.0.0.1:9999#f",
                "`http://127.0.0.1:9999#f`: an address is scheme, host and port only (found `#`)",
            ),
            (
                "http://user:pw@127.0.0.1:9999/",
                "`http://user:pw@127.0.0.1:9999/`: an address carries no user or password",
            ),
            (
                "http://169.254.169.254@127.0.0.1/",
                "`http://169.254.169.254@127.0.0.1/`: an address carries no user or password",
            ),
            (
                "http://127.0.0.1\\@169.254.169.254/",
                "`http://127.0.0.1\\@169.254.169.254/`: an address carries no user or password",
            ),
            ("ftp://127.0.0.1/", "`ftp://127.0.0.1/`: only http and https are accepted"),
            ("127.0.0.1:9999", "`127.0.0.1:9999` is not an http(s) URL"),
            ("http://", "`http://`: the host is empty or has characters a host cannot have"),
            (
                "http://127.0.0.1 /",
                "`http://127.0.0.1 /`: the host is empty or has characters a host cannot have",
            ),
            (
                "http://%31%32%37.0.0.1/",
                "`http://%31%32%37.0.0.1/`: the host is empty or has characters a host cannot have",
            ),
            ("http://127.0.0.1:99999/", "`http://127.0.0.1:99999/`: invalid port number"),
        ];
        let mut failures = Vec::new();
        for (address, expected) in table {
            let actual = check(&policy, address);
            if actual != expected {
                failures.push(format!("{address}\n  expected: {expected}\n  actual:   {actual}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn metadata_opens_only_when_named_specifically() {
        let everything = AddressPolicy::parse(&["0.0.0.0/0", "::/0"]).unwrap();
        assert!(everything.allows_ip("8.8.8.8".parse().unwrap()));
        assert!(everything.allows_ip("2001:db8::1".parse().unwrap()));
        for denied in [
            "169.254.169.254",
            "fe80::1",
            "fd00:ec2::254",
            "100.100.100.200",
            "0.0.0.0",
            "::",
            "64:ff9b::169.254.169.254",
        ] {
            assert!(!everything.allows_ip(denied.parse().unwrap()), "{denied}");
        }
        let specific = AddressPolicy::parse(&["10.0.0.0/8", "169.254.10.0/24"]).unwrap();
        assert!(specific.allows_ip("169.254.10.5".parse().unwrap()));
        assert!(!specific.allows_ip("169.254.169.254".parse().unwrap()));
        let metadata = AddressPolicy::parse(&["169.254.169.254"]).unwrap();
        assert!(metadata.allows_ip("169.254.169.254".parse().unwrap()));
        assert!(metadata.allows_ip("::ffff:169.254.169.254".parse().unwrap()));
    }

    #[test]
    fn host_patterns() {
        let policy =
            AddressPolicy::parse(&["10.0.0.0/8", "exec-1.internal", "*.jobs.internal"]).unwrap();
        let table = [
            ("http://exec-1.internal:9999", "ok name exec-1.internal"),
            ("http://EXEC-1.Internal:9999", "ok name exec-1.internal"),
            ("http://a.jobs.internal:9999", "ok name a.jobs.internal"),
            ("http://a.b.jobs.internal:9999", "ok name a.b.jobs.internal"),
            (
                "http://jobs.internal:9999",
                "`http://jobs.internal:9999`: the host `jobs.internal` is not in the executor allow-list",
            ),
            (
                "http://xjobs.internal:9999",
                "`http://xjobs.internal:9999`: the host `xjobs.internal` is not in the executor allow-list",
            ),
            (
                "http://localhost:9999",
                "`http://localhost:9999`: the host `localhost` is not in the executor allow-list",
            ),
            (
                "http://127.0.0.1:9999",
                "`http://127.0.0.1:9999`: 127.0.0.1 is not in the executor allow-list",
            ),
        ];
        for (address, expected) in table {
            assert_eq!(check(&policy, address), expected, "{address}");
        }
        let any = AddressPolicy::parse(&["10.0.0.0/8", "*"]).unwrap();
        assert_eq!(check(&any, "http://anything.example:1"), "ok name anything.example");
    }

    #[test]
    fn bad_entries_are_refused() {
        let table = [
            (vec!["10.0.0.0/33"], "`10.0.0.0/33`: the prefix length must be 0 to 32"),
            (vec!["10.0.0/8"], "`10.0.0/8` is not an IP address or CIDR"),
            (vec!["fc00::/129"], "`fc00::/129`: the prefix length must be 0 to 128"),
            (
                vec!["10.0.0.0/8", "exa mple"],
                "`exa mple` is neither a CIDR nor a host pattern (`name`, `*.domain` or `*`)",
            ),
            (
                vec!["10.0.0.0/8", "*.*.x"],
                "`*.*.x` is neither a CIDR nor a host pattern (`name`, `*.domain` or `*`)",
            ),
            (vec!["localhost"], "the executor allow-list needs at least one CIDR"),
        ];
        for (entries, expected) in table {
            assert_eq!(AddressPolicy::parse(&entries).unwrap_err(), expected, "{entries:?}");
        }
        let masked = Cidr::parse("10.1.2.3/8").unwrap();
        assert_eq!(masked.to_string(), "10.0.0.0/8");
    }
}
