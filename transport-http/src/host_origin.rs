//! Strict `Host` and `Origin` parsing (RFC 3986 §3.2.2–3.2.3, RFC 6454).
//!
//! An authority here is `host [":" port]` where `host` is an IP-literal
//! (`[` IPv6 `]`), a dotted-decimal IPv4 address or a reg-name (unreserved
//! characters, sub-delims and percent-escapes), and `port` is decimal digits.
//! Everything else is refused, in particular userinfo
//! (`localhost:1@evil.example`), text after an IP-literal
//! (`[::1].evil.example`), IPvFuture and zone identifiers, whitespace and
//! ports above 65535. Host names compare case-insensitively; IP addresses
//! compare by value (`[0:0::1]` is `[::1]`).
//!
//! An origin is `scheme "://" authority` with the scheme `http` or `https`
//! and nothing after the authority (no path, not even `/`).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The host part of an authority.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostName {
    /// A reg-name (a DNS name), lowercased.
    Name(String),
    /// A dotted-decimal IPv4 address.
    V4(Ipv4Addr),
    /// An IPv6 address, written `[…]` on the wire.
    V6(Ipv6Addr),
}

impl HostName {
    /// `localhost`, an address in 127.0.0.0/8, or `::1`.
    pub fn is_loopback(&self) -> bool {
        match self {
            Self::Name(name) => name == "localhost",
            Self::V4(ip) => ip.is_loopback(),
            Self::V6(ip) => ip.is_loopback(),
        }
    }
}

impl fmt::Display for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::V4(ip) => write!(f, "{ip}"),
            Self::V6(ip) => write!(f, "[{ip}]"),
        }
    }
}

/// `host [":" port]`, as in a `Host` header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Authority {
    /// The host.
    pub host: HostName,
    /// The port, when one was written (`host:` with no digits counts as none).
    pub port: Option<u16>,
}

/// Why a `Host` or `Origin` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    /// Nothing to parse.
    #[error("the host is empty")]
    Empty,
    /// `user@host`: a Host header never carries userinfo.
    #[error("userinfo (`…@`) is not allowed")]
    UserInfo,
    /// `[` without a valid IPv6 address and `]` (IPvFuture and zone ids included).
    #[error("an IP-literal must be `[` IPv6 address `]`")]
    BadIpLiteral,
    /// Something other than `:port` follows the host.
    #[error("only `:port` may follow the host")]
    TrailingText,
    /// A character a reg-name may not contain.
    #[error("the host contains `{0}`, which a host name may not contain")]
    BadCharacter(char),
    /// A `%` not followed by two hexadecimal digits.
    #[error("a `%` in the host is not followed by two hexadecimal digits")]
    BadEscape,
    /// The port is not decimal digits, or above 65535.
    #[error("the port must be decimal digits up to 65535")]
    BadPort,
    /// An origin whose scheme is not `http` or `https`.
    #[error("the origin's scheme must be http or https")]
    BadScheme,
    /// An origin with a path, query or fragment after the authority.
    #[error("an origin is `scheme://host[:port]` with nothing after it")]
    NotAnOrigin,
}

impl Authority {
    /// Parses `host [":" port]`.
    pub fn parse(text: &str) -> Result<Self, AuthorityError> {
        if text.is_empty() {
            return Err(AuthorityError::Empty);
        }
        if text.contains('@') {
            return Err(AuthorityError::UserInfo);
        }
        let (host, rest) = if let Some(literal) = text.strip_prefix('[') {
            let end = literal.find(']').ok_or(AuthorityError::BadIpLiteral)?;
            let ip: Ipv6Addr = literal[..end]
                .parse()
                .map_err(|_| AuthorityError::BadIpLiteral)?;
            (HostName::V6(ip), &literal[end + 1..])
        } else {
            // A reg-name and an IPv4 address never contain `:`.
            let end = text.find(':').unwrap_or(text.len());
            (parse_host(&text[..end])?, &text[end..])
        };
        let port = match rest {
            "" => None,
            _ => {
                let digits = rest.strip_prefix(':').ok_or(AuthorityError::TrailingText)?;
                parse_port(digits)?
            }
        };
        Ok(Self { host, port })
    }

    /// The port, or `default` when none was written.
    pub fn port_or(&self, default: u16) -> u16 {
        self.port.unwrap_or(default)
    }
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.host),
            None => write!(f, "{}", self.host),
        }
    }
}

/// A reg-name or an IPv4 address (RFC 3986: IPv4 when it parses as one).
fn parse_host(text: &str) -> Result<HostName, AuthorityError> {
    if text.is_empty() {
        return Err(AuthorityError::Empty);
    }
    if let Ok(ip) = text.parse::<Ipv4Addr>() {
        return Ok(HostName::V4(ip));
    }
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {}
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' => {}
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or(AuthorityError::BadEscape)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return Err(AuthorityError::BadEscape);
                }
                i += 2;
            }
            _ => {
                let c = text[i..].chars().next().unwrap_or('?');
                return Err(AuthorityError::BadCharacter(c));
            }
        }
        i += 1;
    }
    Ok(HostName::Name(text.to_ascii_lowercase()))
}

fn parse_port(digits: &str) -> Result<Option<u16>, AuthorityError> {
    if digits.is_empty() {
        return Ok(None);
    }
    let mut value: u32 = 0;
    for b in digits.bytes() {
        if !b.is_ascii_digit() {
            return Err(AuthorityError::BadPort);
        }
        value = value * 10 + u32::from(b - b'0');
        if value > u32::from(u16::MAX) {
            return Err(AuthorityError::BadPort);
        }
    }
    u16::try_from(value)
        .map(Some)
        .map_err(|_| AuthorityError::BadPort)
}

/// The scheme of an origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `http`, default port 80.
    Http,
    /// `https`, default port 443.
    Https,
}

impl Scheme {
    /// 80 or 443.
    pub const fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }

    /// `http` or `https`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }
}

/// `scheme "://" host [":" port]`, as in an `Origin` header or a base URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// Host and optional port.
    pub authority: Authority,
}

impl Origin {
    /// Parses an origin; nothing may follow the authority.
    pub fn parse(text: &str) -> Result<Self, AuthorityError> {
        let (scheme, rest) = text.split_once("://").ok_or(AuthorityError::BadScheme)?;
        let scheme = if scheme.eq_ignore_ascii_case("http") {
            Scheme::Http
        } else if scheme.eq_ignore_ascii_case("https") {
            Scheme::Https
        } else {
            return Err(AuthorityError::BadScheme);
        };
        if rest.contains(['/', '?', '#']) {
            return Err(AuthorityError::NotAnOrigin);
        }
        Ok(Self {
            scheme,
            authority: Authority::parse(rest)?,
        })
    }

    /// Parses the origin of a base URL such as `https://relay.example.com/`
    /// (a path is allowed and ignored).
    pub fn of_url(url: &str) -> Result<Self, AuthorityError> {
        let (scheme, rest) = url.split_once("://").ok_or(AuthorityError::BadScheme)?;
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        Self::parse(&format!("{scheme}://{}", &rest[..end]))
    }

    /// The port, explicit or the scheme's default.
    pub fn port(&self) -> u16 {
        self.authority.port_or(self.scheme.default_port())
    }

    /// Same scheme, same host and same effective port.
    pub fn same_as(&self, other: &Origin) -> bool {
        self.scheme == other.scheme
            && self.authority.host == other.authority.host
            && self.port() == other.port()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_authorities() {
        let a = Authority::parse("LocalHost:8787").unwrap();
        assert_eq!(a.host, HostName::Name("localhost".into()));
        assert_eq!(a.port, Some(8787));
        assert_eq!(
            Authority::parse("127.0.0.1").unwrap().host,
            HostName::V4(Ipv4Addr::LOCALHOST)
        );
        let v6 = Authority::parse("[0:0::1]:80").unwrap();
        assert_eq!(v6.host, HostName::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(v6.to_string(), "[::1]:80");
        assert_eq!(Authority::parse("relay.example.com:").unwrap().port, None);
        assert_eq!(Authority::parse("a:0080").unwrap().port, Some(80));
        // RFC 3986: not a valid IPv4 address, so a reg-name (which no allow list names).
        assert_eq!(
            Authority::parse("127.0.0.01").unwrap().host,
            HostName::Name("127.0.0.01".into())
        );
    }

    #[test]
    fn bad_authorities() {
        use AuthorityError::*;
        for (text, error) in [
            ("", Empty),
            (":80", Empty),
            ("localhost:1@evil.example", UserInfo),
            ("user@localhost", UserInfo),
            ("[::1].evil.example", TrailingText),
            ("[::1]evil", TrailingText),
            ("[::1", BadIpLiteral),
            ("[v1.fe]", BadIpLiteral),
            ("[fe80::1%25eth0]", BadIpLiteral),
            ("[127.0.0.1]", BadIpLiteral),
            ("localhost:80:80", BadPort),
            ("localhost:65536", BadPort),
            ("localhost:-1", BadPort),
            ("localhost:8o", BadPort),
            ("local host", BadCharacter(' ')),
            ("localhost/", BadCharacter('/')),
            ("évil.example", BadCharacter('é')),
            ("evil%2", BadEscape),
            ("evil%zz.example", BadEscape),
        ] {
            assert_eq!(Authority::parse(text), Err(error), "{text:?}");
        }
    }

    #[test]
    fn origins() {
        let o = Origin::parse("HTTPS://App.Example.com").unwrap();
        assert_eq!(o.scheme, Scheme::Https);
        assert_eq!(o.port(), 443);
        assert!(o.same_as(&Origin::parse("https://app.example.com:443").unwrap()));
        assert!(!o.same_as(&Origin::parse("http://app.example.com").unwrap()));
        for bad in [
            "null",
            "http://localhost:3000/",
            "http://localhost.evil.com/x",
            "ftp://localhost",
            "http://localhost:1@evil.example",
            "http://[::1].evil.example",
            "localhost:3000",
        ] {
            assert!(Origin::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Origin::of_url("https://relay.example.com/base/")
                .unwrap()
                .port(),
            443
        );
    }
}
