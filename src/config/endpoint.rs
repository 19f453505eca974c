//! `host:port` as an operator writes it in a configuration: an IP literal
//! (`10.0.0.1:7946`, `[fd00::1]:7946`) or a hostname (`orch-1:7947`),
//! resolved when it is used, so a name that moves to another machine is
//! followed (design §10).

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

/// A `host:port` checked for its shape, resolved on use.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    text: String,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.text)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(addr: SocketAddr) -> Self {
        Endpoint {
            text: addr.to_string(),
        }
    }
}

impl Endpoint {
    /// Checks `text` is `host:port`: an IP address or a hostname of
    /// letters, digits, `-`, `_` and `.` (at most 253 bytes), and a port.
    pub fn parse(text: &str) -> Result<Endpoint, String> {
        let bad =
            || format!("`{text}` is not \"host:port\" (like \"10.0.0.1:7946\" or \"orch-1:7946\")");
        if text.parse::<SocketAddr>().is_ok() {
            return Ok(Endpoint { text: text.into() });
        }
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        port.parse::<u16>().map_err(|_| bad())?;
        let hostname = !host.is_empty()
            && host.len() <= 253
            && !host.starts_with(['-', '.'])
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !hostname {
            return Err(bad());
        }
        Ok(Endpoint { text: text.into() })
    }

    /// As written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The address itself when it is an IP literal (no lookup).
    pub fn literal(&self) -> Option<SocketAddr> {
        self.text.parse().ok()
    }

    /// Every address the name resolves to now (the system's resolver:
    /// `/etc/hosts`, DNS). An error says which name failed.
    pub fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        if let Some(addr) = self.literal() {
            return Ok(vec![addr]);
        }
        let addrs: Vec<SocketAddr> = self
            .text
            .to_socket_addrs()
            .map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot resolve {}: {e}", self.text))
            })?
            .collect();
        if addrs.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} resolves to no address", self.text),
            ));
        }
        Ok(addrs)
    }

    /// The first address of the family `like` is of (IPv4 or IPv6), else
    /// the first address.
    pub fn resolve_like(&self, like: SocketAddr) -> std::io::Result<SocketAddr> {
        let addrs = self.resolve()?;
        let same = addrs.iter().find(|a| a.is_ipv4() == like.is_ipv4());
        Ok(*same.unwrap_or(&addrs[0]))
    }
}

/// Resolves every endpoint without blocking the caller's thread (the
/// lookup runs on the runtime's blocking pool, bounded by
/// [`LOOKUP_LIMIT`]): the addresses found, and what failed, in words.
pub async fn lookup_all(endpoints: &[Endpoint]) -> (Vec<SocketAddr>, Vec<String>) {
    let mut addrs = Vec::new();
    let mut failed = Vec::new();
    for endpoint in endpoints {
        if let Some(addr) = endpoint.literal() {
            addrs.push(addr);
            continue;
        }
        let lookup = tokio::net::lookup_host(endpoint.as_str());
        match tokio::time::timeout(LOOKUP_LIMIT, lookup).await {
            Ok(Ok(found)) => {
                let before = addrs.len();
                addrs.extend(found);
                if addrs.len() == before {
                    failed.push(format!("{endpoint} resolves to no address"));
                }
            }
            Ok(Err(e)) => failed.push(format!("cannot resolve {endpoint}: {e}")),
            Err(_) => failed.push(format!("cannot resolve {endpoint} within {LOOKUP_LIMIT:?}")),
        }
    }
    (addrs, failed)
}

/// The longest a name lookup may take before it counts as failed.
pub const LOOKUP_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_literals_and_hostnames_are_accepted_and_other_text_refused() {
        for good in [
            "10.0.0.1:7946",
            "[::1]:7946",
            "orch-1:7947",
            "a.b_c.example:1",
        ] {
            assert_eq!(Endpoint::parse(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            "orch",
            "orch:",
            ":7946",
            "orch:99999",
            "-x:1",
            "a b:1",
            "x:y",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn localhost_resolves_and_a_literal_needs_no_lookup() {
        let local = Endpoint::parse("localhost:7946").unwrap();
        let addrs = local.resolve().unwrap();
        assert!(addrs
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 7946));
        let like = SocketAddr::from(([0, 0, 0, 0], 1));
        assert!(local.resolve_like(like).unwrap().is_ipv4());
        let literal = Endpoint::parse("10.1.2.3:5").unwrap();
        assert_eq!(
            literal.literal(),
            Some(SocketAddr::from(([10, 1, 2, 3], 5)))
        );
    }

    #[test]
    fn a_name_that_does_not_resolve_is_named_in_the_error() {
        let missing = Endpoint::parse("no-such-host.invalid:1").unwrap();
        let error = missing.resolve().unwrap_err().to_string();
        assert!(error.contains("no-such-host.invalid"), "{error}");
    }
}
