//! Which requests the producer's API serves, judged by what a browser could have made of them.
//!
//! The API is called by programs (curl, the SDKs, `sluice`, `sluice mcp`) and by one page, the
//! console the producer serves at `/ui`. Any other page the operator visits can make their
//! browser send requests to it too, and in open mode (`producer.open`: no tokens, on loopback)
//! nothing else stands in the way. So nothing a browser sends is trusted by default; each
//! request passes three checks, in this order, before its route:
//!
//! 1. **`Host`** must be a name of this server: `localhost`, an IP address (any: a page can only
//!    be at an IP address if that address serves it, so a literal address cannot be rebound),
//!    or one listed in `producer.allowed_hosts`. Otherwise a page at a name its author controls,
//!    made to resolve to 127.0.0.1 after it loaded (DNS rebinding), would be same-origin with
//!    the API in the browser's eyes: its `fetch` carries no `Origin` on a GET and would read
//!    every run. Refused: 421 Misdirected Request.
//! 2. **`Origin`**, when sent (a browser sends it on every cross-origin request and on a
//!    same-origin one that is not a GET or HEAD), must be this server's own — the scheme and the
//!    `Host` it was reached at, as the console's own requests carry — or one listed in
//!    `producer.allowed_origins`, which then gets CORS headers. `Origin: null` (a sandboxed
//!    frame, a file) is never allowed. Refused: 403.
//! 3. **`Sec-Fetch-Site`**, when there is no `Origin`: a browser marks a request it sends from
//!    another site (`cross-site`, `same-site`) even when it sends no `Origin` (an image, a script,
//!    a link). Only a navigation (a link followed to the console or to an API URL, shown in the
//!    tab where no other page can read it) is served; anything else a page made the browser
//!    load is refused: 403. Programs send no `Sec-Fetch-Site`.
//!
//! A request without `Host` is no browser's (every browser sends one) and passes the first
//! check. These are rules, so they are here; the producer carries them out
//! (`services/producer/src/guard.rs`) and answers with the [`Refusal`]'s words.

use std::net::{IpAddr, Ipv6Addr};

/// The configuration key that lists the extra names the API answers to.
pub const ALLOWED_HOSTS_KEY: &str = "producer.allowed_hosts";
/// The configuration key that lists the other origins whose pages may call the API.
pub const ALLOWED_ORIGINS_KEY: &str = "producer.allowed_origins";

/// A `Host` (or an allowed host entry) taken apart: the name in lower case (an IPv6 address
/// without its brackets) and the port, if given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    name: String,
    port: Option<u16>,
    ip: Option<IpAddr>,
}

impl Authority {
    /// `name[:port]` or `[ipv6][:port]`, as `Host` carries it (RFC 9110 §7.2): a name of ASCII
    /// letters, digits, `-`, `.` and `_`; `None` for anything else (a path, a scheme, user
    /// information, spaces, an IPv6 address without brackets).
    pub fn parse(raw: &str) -> Option<Self> {
        let (name, port) = if let Some(rest) = raw.strip_prefix('[') {
            let (address, after) = rest.split_once(']')?;
            let ip: Ipv6Addr = address.parse().ok()?;
            let port = match after {
                "" => None,
                _ => Some(port_of(after.strip_prefix(':')?)?),
            };
            return Some(Self {
                name: ip.to_string(),
                port,
                ip: Some(IpAddr::V6(ip)),
            });
        } else {
            match raw.split_once(':') {
                Some((name, port)) => (name, Some(port_of(port)?)),
                None => (raw, None),
            }
        };
        let name_ok = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !name_ok {
            return None;
        }
        let name = name.to_ascii_lowercase();
        let ip = name.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4);
        Some(Self { name, port, ip })
    }

    /// The name in lower case (an IPv6 address without brackets).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The address, when the name is an IP literal.
    pub fn ip(&self) -> Option<IpAddr> {
        self.ip
    }
}

/// A port: 1 to 5 digits that fit in 16 bits.
fn port_of(digits: &str) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What a request says about where it comes from: its method and the headers the checks read
/// (`None` when absent; a header that is not text is given as text that matches nothing).
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    pub method: &'a str,
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    /// `Sec-Fetch-Site`.
    pub fetch_site: Option<&'a str>,
    /// `Sec-Fetch-Mode`.
    pub fetch_mode: Option<&'a str>,
    /// `Sec-Fetch-Dest`.
    pub fetch_dest: Option<&'a str>,
}

/// What to do with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Not a browser's request from elsewhere: served as it is.
    Serve,
    /// A page of a listed origin: served, with CORS headers naming it (and its preflight
    /// answered).
    Cors(&'a str),
    /// Refused before any route.
    Refuse(Refusal<'a>),
}

/// Why a request is refused, with the value refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal<'a> {
    /// `Host` is not a name of this server: 421.
    Host(&'a str),
    /// `Origin` is neither this server's nor listed: 403.
    Origin(&'a str),
    /// `Sec-Fetch-Site` says another site's page made the browser send it, with no `Origin`,
    /// and it is not a navigation: 403.
    Site(&'a str),
}

impl<'a> Refusal<'a> {
    /// What was refused: `host`, `origin` or `sec-fetch-site`.
    pub fn refused(&self) -> &'static str {
        match self {
            Self::Host(_) => "host",
            Self::Origin(_) => "origin",
            Self::Site(_) => "sec-fetch-site",
        }
    }

    /// The value refused, as the request sent it.
    pub fn value(&self) -> &'a str {
        match self {
            Self::Host(value) | Self::Origin(value) | Self::Site(value) => value,
        }
    }

    /// The configuration key that would allow it.
    pub fn config_key(&self) -> &'static str {
        match self {
            Self::Host(_) => ALLOWED_HOSTS_KEY,
            Self::Origin(_) | Self::Site(_) => ALLOWED_ORIGINS_KEY,
        }
    }

    /// The refusal in words: what was refused, why, and what allows it.
    pub fn explain(&self) -> String {
        let value = shown(self.value());
        match self {
            Self::Host(_) => format!(
                "Host {value} is not a name of this server: it answers to localhost, IP \
                 addresses and the names listed in {ALLOWED_HOSTS_KEY} (a page at another name \
                 that resolves here could otherwise read the API: DNS rebinding); a deployment \
                 reached by a name lists it there"
            ),
            Self::Origin(_) => format!(
                "a browser request from origin {value}, which is neither this server's own nor \
                 listed in {ALLOWED_ORIGINS_KEY}; a page that is to call the API has its origin \
                 listed there"
            ),
            Self::Site(_) => format!(
                "a request a browser sent from another site's page (Sec-Fetch-Site: {value}) \
                 with no Origin, and not a navigation; a page of an origin listed in \
                 {ALLOWED_ORIGINS_KEY} calls the API with fetch, which sends its Origin"
            ),
        }
    }
}

/// A header value as an answer shows it: quoted, at most 100 characters.
fn shown(value: &str) -> String {
    let cut: String = value.chars().take(100).collect();
    format!("{cut:?}")
}

/// One entry of `producer.allowed_hosts`: a name, and the port it must come with (any when
/// none is given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost(Authority);

impl AllowedHost {
    /// `name` or `name:port` as a client sends it in `Host` (`sluice.example.com`,
    /// `sluice-producer:8700`); letters are taken in any case.
    pub fn parse(entry: &str) -> Result<Self, String> {
        if entry == "*" || entry.contains('*') {
            return Err(format!(
                "{entry:?}: no wildcards; list each name the API is reached by"
            ));
        }
        if entry.contains("://") || entry.contains('/') {
            return Err(format!(
                "{entry:?} must be a host name as sent in Host (sluice.example.com, or \
                 sluice.example.com:443), with no scheme or path"
            ));
        }
        Authority::parse(entry).map(Self).ok_or_else(|| {
            format!(
                "{entry:?} must be a host name as sent in Host: letters, digits, '-', '.' and \
                 '_', then optionally ':' and a port"
            )
        })
    }

    fn admits(&self, host: &Authority) -> bool {
        self.0.name == host.name && self.0.port.is_none_or(|port| host.port == Some(port))
    }
}

/// An allowed origin is `http(s)://host[:port]`, lower case, nothing after: browsers send
/// exactly that in `Origin`, and the comparison is of the whole text.
pub fn check_allowed_origin(origin: &str) -> Result<(), String> {
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or_else(|| format!("{origin:?} must start with http:// or https://"))?;
    let host_ok = !rest.is_empty()
        && rest.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || matches!(b, b'.' | b'-' | b':' | b'[' | b']')
        });
    if !host_ok {
        return Err(format!(
            "{origin:?} must be scheme://host[:port] in lower case, with no path, as a browser \
             sends it in Origin"
        ));
    }
    Ok(())
}

/// A configured entry that is not valid: which list, its index, why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}[{index}]: {why}")]
pub struct EntryError {
    pub key: &'static str,
    pub index: usize,
    pub why: String,
}

/// The configured exceptions: the names the API answers to besides `localhost` and IP
/// addresses, and the origins whose pages may call it besides its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowed {
    hosts: Vec<AllowedHost>,
    origins: Vec<String>,
}

impl Allowed {
    /// From `producer.allowed_hosts` and `producer.allowed_origins`; the first entry that is not
    /// valid is named.
    pub fn new(hosts: &[String], origins: &[String]) -> Result<Self, EntryError> {
        let hosts = hosts
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                AllowedHost::parse(entry).map_err(|why| EntryError {
                    key: ALLOWED_HOSTS_KEY,
                    index,
                    why,
                })
            })
            .collect::<Result<_, _>>()?;
        for (index, origin) in origins.iter().enumerate() {
            check_allowed_origin(origin).map_err(|why| EntryError {
                key: ALLOWED_ORIGINS_KEY,
                index,
                why,
            })?;
        }
        Ok(Self {
            hosts,
            origins: origins.to_vec(),
        })
    }

    /// Whether `host` (a `Host` value) is a name of this server.
    pub fn host_allowed(&self, host: &str) -> bool {
        let Some(host) = Authority::parse(host) else {
            return false;
        };
        host.ip.is_some()
            || host.name == "localhost"
            || self.hosts.iter().any(|allowed| allowed.admits(&host))
    }

    /// The checks of the module's documentation, in order.
    pub fn judge<'a>(&self, request: &Request<'a>) -> Verdict<'a> {
        if let Some(host) = request.host
            && !self.host_allowed(host)
        {
            return Verdict::Refuse(Refusal::Host(host));
        }
        if let Some(origin) = request.origin {
            // The server's own origin: the authority the browser reached it at, under either
            // scheme (behind a proxy that ends TLS the page is https and the request arrives
            // as http).
            let own = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .zip(request.host)
                .is_some_and(|(authority, host)| {
                    !authority.is_empty() && authority.eq_ignore_ascii_case(host)
                });
            if own {
                return Verdict::Serve;
            }
            if self.origins.iter().any(|listed| listed == origin) {
                return Verdict::Cors(origin);
            }
            return Verdict::Refuse(Refusal::Origin(origin));
        }
        match request.fetch_site {
            None | Some("same-origin" | "none") => Verdict::Serve,
            Some(_) if is_navigation(request) => Verdict::Serve,
            Some(site) => Verdict::Refuse(Refusal::Site(site)),
        }
    }
}

/// A link followed (or an address typed): a GET or HEAD the browser shows in a tab or frame,
/// where another site's page cannot read it (`object` and `embed` are loaded into the page).
fn is_navigation(request: &Request<'_>) -> bool {
    request.fetch_mode == Some("navigate")
        && matches!(request.method, "GET" | "HEAD")
        && !matches!(request.fetch_dest, Some("object" | "embed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(hosts: &[&str], origins: &[&str]) -> Allowed {
        let owned = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        Allowed::new(&owned(hosts), &owned(origins)).expect("valid entries")
    }

    fn get<'a>(host: &'a str) -> Request<'a> {
        Request {
            method: "GET",
            host: Some(host),
            ..Request::default()
        }
    }

    #[test]
    fn hosts_are_loopback_names_ip_addresses_and_the_listed_ones() {
        let none = allowed(&[], &[]);
        for host in [
            "localhost",
            "localhost:8700",
            "LOCALHOST:8700",
            "127.0.0.1",
            "127.0.0.1:8700",
            "10.0.3.7:8700",
            "[::1]:8700",
            "[::1]",
            "[fd00::17]:443",
        ] {
            assert!(none.host_allowed(host), "{host}");
            assert_eq!(none.judge(&get(host)), Verdict::Serve, "{host}");
        }
        for host in [
            "rebind.example",
            "rebind.example:8700",
            "localhost.",
            "localhost.rebind.example",
            "127.0.0.1.rebind.example",
            "sluice-producer:8700",
            "",
            ":8700",
            "localhost:",
            "localhost:99999",
            "localhost:8700:1",
            "::1",
            "[::1",
            "[not-v6]:80",
            "user@localhost",
            "local host",
            "\u{FFFD}",
        ] {
            assert!(!none.host_allowed(host), "{host:?}");
            assert_eq!(
                none.judge(&get(host)),
                Verdict::Refuse(Refusal::Host(host)),
                "{host:?}"
            );
        }
        let listed = allowed(
            &[
                "sluice-producer",
                "Sluice.Example.com",
                "ops.example.com:8443",
            ],
            &[],
        );
        for host in [
            "sluice-producer",
            "sluice-producer:8700",
            "sluice.example.com",
            "SLUICE.example.com:443",
            "ops.example.com:8443",
        ] {
            assert!(listed.host_allowed(host), "{host}");
        }
        for host in [
            "sluice-producer.evil.example",
            "evil-sluice-producer",
            "ops.example.com",
            "ops.example.com:8700",
            "example.com",
        ] {
            assert!(!listed.host_allowed(host), "{host}");
        }
        // No Host at all: no browser's request.
        assert_eq!(
            none.judge(&Request {
                method: "GET",
                ..Request::default()
            }),
            Verdict::Serve
        );
    }

    #[test]
    fn origins_are_the_servers_own_or_listed() {
        let rules = allowed(&["sluice.example.com"], &["https://console.example.com"]);
        let with = |host: &'static str, origin: &'static str| Request {
            method: "POST",
            host: Some(host),
            origin: Some(origin),
            ..Request::default()
        };
        for (host, origin) in [
            ("127.0.0.1:8700", "http://127.0.0.1:8700"),
            ("127.0.0.1:8700", "https://127.0.0.1:8700"),
            ("localhost:8700", "http://LocalHost:8700"),
            ("sluice.example.com", "https://sluice.example.com"),
        ] {
            assert_eq!(rules.judge(&with(host, origin)), Verdict::Serve, "{origin}");
        }
        assert_eq!(
            rules.judge(&with("127.0.0.1:8700", "https://console.example.com")),
            Verdict::Cors("https://console.example.com")
        );
        for origin in [
            "https://evil.example",
            "null",
            "http://127.0.0.1:8701",
            "http://",
            "127.0.0.1:8700",
            "ftp://127.0.0.1:8700",
            "https://console.example.com.evil.example",
            "https://console.example.com/",
        ] {
            assert_eq!(
                rules.judge(&with("127.0.0.1:8700", origin)),
                Verdict::Refuse(Refusal::Origin(origin)),
                "{origin}"
            );
        }
        // A rebound page's own origin does not make its Host this server's.
        assert_eq!(
            rules.judge(&with("rebind.example:8700", "http://rebind.example:8700")),
            Verdict::Refuse(Refusal::Host("rebind.example:8700"))
        );
        // No Host: only a listed origin.
        let hostless = Request {
            method: "POST",
            origin: Some("http://127.0.0.1:8700"),
            ..Request::default()
        };
        assert_eq!(
            rules.judge(&hostless),
            Verdict::Refuse(Refusal::Origin("http://127.0.0.1:8700"))
        );
    }

    #[test]
    fn a_page_of_another_site_gets_only_its_navigations_served() {
        let rules = allowed(&[], &[]);
        let fetched = |method: &'static str,
                       site: &'static str,
                       mode: &'static str,
                       dest: &'static str| Request {
            method,
            host: Some("127.0.0.1:8700"),
            fetch_site: Some(site),
            fetch_mode: Some(mode),
            fetch_dest: Some(dest),
            ..Request::default()
        };
        for (method, site, mode, dest) in [
            ("GET", "same-origin", "cors", "empty"),
            ("GET", "none", "navigate", "document"),
            ("GET", "cross-site", "navigate", "document"),
            ("GET", "same-site", "navigate", "iframe"),
            ("HEAD", "cross-site", "navigate", "document"),
        ] {
            assert_eq!(
                rules.judge(&fetched(method, site, mode, dest)),
                Verdict::Serve,
                "{method} {site} {mode} {dest}"
            );
        }
        for (method, site, mode, dest) in [
            ("GET", "cross-site", "no-cors", "image"),
            ("GET", "cross-site", "no-cors", "script"),
            ("GET", "same-site", "no-cors", "image"),
            ("GET", "cross-site", "navigate", "object"),
            ("GET", "cross-site", "navigate", "embed"),
            ("POST", "cross-site", "navigate", "document"),
            ("GET", "something-new", "cors", "empty"),
        ] {
            assert_eq!(
                rules.judge(&fetched(method, site, mode, dest)),
                Verdict::Refuse(Refusal::Site(site)),
                "{method} {site} {mode} {dest}"
            );
        }
        // Node's fetch says `Sec-Fetch-Mode: cors` and nothing of a site: a program, served.
        let node = Request {
            method: "POST",
            host: Some("127.0.0.1:8700"),
            fetch_mode: Some("cors"),
            ..Request::default()
        };
        assert_eq!(rules.judge(&node), Verdict::Serve);
    }

    #[test]
    fn a_refusal_names_what_it_refused_and_the_key_that_allows_it() {
        let host = Refusal::Host("rebind.example:8700");
        assert_eq!(
            (host.refused(), host.config_key()),
            ("host", "producer.allowed_hosts")
        );
        assert!(host.explain().contains("\"rebind.example:8700\""));
        assert!(host.explain().contains("producer.allowed_hosts"));
        let origin = Refusal::Origin("https://evil.example");
        assert_eq!(
            (origin.refused(), origin.config_key()),
            ("origin", "producer.allowed_origins")
        );
        assert!(origin.explain().contains("https://evil.example"));
        let site = Refusal::Site("cross-site");
        assert_eq!(site.refused(), "sec-fetch-site");
        assert!(site.explain().contains("producer.allowed_origins"));
        let long = "x".repeat(500);
        assert!(Refusal::Host(&long).explain().len() < 500, "a value is cut");
    }

    #[test]
    fn configured_entries_are_checked() {
        let err = Allowed::new(&["ok.example".into(), "https://bad.example".into()], &[])
            .expect_err("a scheme");
        assert_eq!((err.key, err.index), ("producer.allowed_hosts", 1));
        for bad in [
            "*",
            "*.example.com",
            "",
            "host/path",
            "host:port",
            "host:70000",
            "a b",
            "[::1",
        ] {
            let err = Allowed::new(&[bad.to_owned()], &[]).expect_err(bad);
            assert!(
                err.to_string().starts_with("producer.allowed_hosts[0]: "),
                "{err}"
            );
        }
        for good in [
            "sluice-producer",
            "sluice.example.com:443",
            "[::1]:8700",
            "my_service",
        ] {
            Allowed::new(&[good.to_owned()], &[]).expect(good);
        }
        for bad in [
            "ops.example.com",
            "https://ops.example.com/",
            "https://Ops.example.com",
            "*",
        ] {
            let err = Allowed::new(&[], &[bad.to_owned()]).expect_err(bad);
            assert_eq!(
                (err.key, err.index),
                ("producer.allowed_origins", 0),
                "{bad}"
            );
        }
        Allowed::new(
            &[],
            &[
                "https://ops.example.com".into(),
                "http://127.0.0.1:3000".into(),
            ],
        )
        .expect("origins as browsers send them");
    }
}
