//! Where a pull goes and with which credentials: the configured mirrors first, then the
//! registry itself (HTTPS; plain HTTP for `insecure` and loopback registries), and the
//! request's credentials, which go only to the registry they were given for.

use std::collections::BTreeMap;

use sha2::Digest;

use super::reference::Reference;
use super::registry::{api_host, Creds};
use crate::config::RegistryConfig;

/// Credentials from the request (CRI `AuthConfig`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// Basic auth's user, for the registry named by `server_address`.
    pub username: String,
    /// Basic auth's password.
    pub password: String,
    /// A registry (bearer) token used as is.
    pub registry_token: String,
    /// The registry the credentials are for (`host[:port]`, a URL is accepted); empty = the
    /// image's own registry.
    pub server_address: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Auth {{ username: {:?}, server_address: {:?}, .. }}",
            self.username, self.server_address
        )
    }
}

impl Auth {
    fn creds(&self) -> Option<Creds> {
        if !self.registry_token.is_empty() {
            Some(Creds::Bearer(self.registry_token.clone()))
        } else if !self.username.is_empty() {
            Some(Creds::Basic(self.username.clone(), self.password.clone()))
        } else {
            None
        }
    }

    /// The credentials for endpoint `host` of an image on registry `domain`: only if `host`
    /// is the registry they were given for.
    pub(super) fn for_endpoint(&self, host: &str, domain: &str) -> Option<Creds> {
        let target = if self.server_address.is_empty() {
            domain.to_string()
        } else {
            let s = self.server_address.trim_end_matches('/');
            let s = s.split_once("://").map_or(s, |(_, rest)| rest);
            s.split('/').next().unwrap_or(s).to_string()
        };
        let norm = |h: &str| api_host(h).to_ascii_lowercase();
        (norm(&target) == norm(host))
            .then(|| self.creds())
            .flatten()
    }

    /// A key telling apart pulls that may share one download (same image, same credentials).
    pub fn share_key(&self) -> String {
        let mut h = sha2::Sha256::new();
        for f in [
            &self.username,
            &self.password,
            &self.registry_token,
            &self.server_address,
        ] {
            h.update((f.len() as u64).to_be_bytes());
            h.update(f.as_bytes());
        }
        super::unpack::hex(&h.finalize())
    }
}

fn is_loopback(host_port: &str) -> bool {
    let host = host_port
        .rsplit_once(':')
        .filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()))
        .map_or(host_port, |(h, _)| h);
    host == "localhost"
        || host == "[::1]"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `(host, plain http)` of every endpoint to try, in order: the mirrors (with the scheme
/// their URL names, HTTPS by default), then the registry (HTTPS, then HTTP if insecure).
pub(super) fn endpoints(
    r: &Reference,
    registries: &BTreeMap<String, RegistryConfig>,
) -> Vec<(String, bool)> {
    let cfg = registries.get(&r.domain).cloned().unwrap_or_default();
    let mut out: Vec<(String, bool)> = cfg
        .mirrors
        .iter()
        .filter_map(|m| {
            let (http, rest) = match m.split_once("://") {
                Some(("http", rest)) => (true, rest),
                Some((_, rest)) => (false, rest),
                None => (false, m.as_str()),
            };
            let host = rest.trim_end_matches('/');
            (!host.is_empty()).then(|| (host.to_string(), http))
        })
        .collect();
    let host = api_host(&r.domain).to_string();
    out.push((host.clone(), false));
    if cfg.insecure || is_loopback(&r.domain) {
        out.push((host, true));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_mirrors_first_loopback_plain() {
        let mut regs = BTreeMap::new();
        regs.insert(
            "docker.io".to_string(),
            RegistryConfig {
                mirrors: vec!["http://127.0.0.1:5001/".into(), "mirror.example".into()],
                ..Default::default()
            },
        );
        let r = Reference::parse("busybox").unwrap();
        assert_eq!(
            endpoints(&r, &regs),
            vec![
                ("127.0.0.1:5001".to_string(), true),
                ("mirror.example".to_string(), false),
                ("registry-1.docker.io".to_string(), false)
            ]
        );
        let r = Reference::parse("127.0.0.1:5000/x:1").unwrap();
        assert_eq!(
            endpoints(&r, &regs),
            vec![
                ("127.0.0.1:5000".into(), false),
                ("127.0.0.1:5000".into(), true)
            ]
        );
        assert!(is_loopback("localhost:5000") && !is_loopback("example.com:5000"));
    }

    #[test]
    fn credentials_only_for_their_registry() {
        let a = Auth {
            username: "u".into(),
            password: "p".into(),
            ..Default::default()
        };
        assert!(a
            .for_endpoint("registry-1.docker.io", "docker.io")
            .is_some());
        assert!(a.for_endpoint("mirror.example", "docker.io").is_none());
        let a = Auth {
            server_address: "https://mirror.example/".into(),
            ..a
        };
        assert!(a.for_endpoint("mirror.example", "docker.io").is_some());
        assert!(a
            .for_endpoint("registry-1.docker.io", "docker.io")
            .is_none());
        assert_ne!(a.share_key(), Auth::default().share_key());
    }
}
