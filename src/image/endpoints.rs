//! Where a pull goes and with which credentials: the configured mirrors first, then the
//! registry itself (HTTPS; plain HTTP for `insecure` and loopback registries) — from
//! `[registries]`, else from the peers' files (`hosts_toml.rs`, `registries_conf.rs`) —, and
//! the request's credentials, which go only to the registry they were given for, else the
//! global auth file's (`auth_file.rs`).

use std::collections::BTreeMap;
use std::path::Path;

use sha2::Digest;

use super::reference::Reference;
use super::registry::{api_host, Creds};
use crate::config::{RegistryConfig, RegistryFilesConfig};
use crate::error::Error;

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

pub(super) fn is_loopback(host_port: &str) -> bool {
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

/// One place a pull may fetch from (handed to a lazy layer's server as JSON on a pipe).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Endpoint {
    /// `host[:port]`: whose credentials it gets; named in logs and errors.
    pub host: String,
    /// `http://` rather than `https://`.
    pub plain_http: bool,
    /// The API's root path: `/v2`, `<path>/v2`, or a hosts.toml `override_path` as given.
    pub root: String,
    /// The repository there (a registries.conf `location` may move it).
    pub repo: String,
    /// PEM CA certificates trusted besides the system's.
    pub ca: Vec<u8>,
    /// Any certificate accepted (hosts.toml `skip_verify`, registries.conf `insecure`).
    pub skip_verify: bool,
}

impl Endpoint {
    /// `scheme://host[:port]<root>`
    pub fn url(&self) -> String {
        let scheme = if self.plain_http { "http" } else { "https" };
        format!("{scheme}://{}{}", self.host, self.root)
    }
}

/// `(plain http, host[:port], path without a trailing '/')` of `[http[s]://]host[:port][/path]`.
pub(super) fn split_url(u: &str) -> Option<(bool, String, String)> {
    let (http, rest) = match u.split_once("://") {
        Some(("http", rest)) => (true, rest),
        Some(("https", rest)) => (false, rest),
        Some(_) => return None,
        None => (false, u),
    };
    let rest = rest.trim_end_matches('/');
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        && !path.contains(['?', '#', ' ']);
    ok.then(|| (http, host.to_string(), path.to_string()))
}

/// A registry configuration file's text, at most `max` bytes; None if it does not exist.
/// (The operator's own files: a symlink is followed, as the peers do.)
pub(crate) fn read_config_file(path: &Path, max: u64) -> Result<Option<String>, Error> {
    let bad = |e: String| Error::Config(format!("{}: {e}", path.display()));
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(e.to_string())),
        Ok(_) => {}
    }
    // A regular file only, opened without blocking (a FIFO in its place stalls no pull),
    // bounded; symlinks followed: these are root's files, as the peers read them.
    let bytes =
        crate::untrusted_fs::read_file(path, max).map_err(|e| Error::Config(e.to_string()))?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| bad("not UTF-8".into()))
}

/// Every endpoint to try for `r`, in order. The first source that speaks for the registry
/// decides: `[registries]` (mirrors with the scheme their URL names, HTTPS by default, then
/// the registry: HTTPS, then HTTP if insecure or loopback), else a hosts.toml, else
/// registries.conf, else the registry itself as `[registries]` would have it.
pub(super) fn endpoints(
    r: &Reference,
    registries: &BTreeMap<String, RegistryConfig>,
    files: &RegistryFilesConfig,
) -> Result<Vec<Endpoint>, Error> {
    if !registries.contains_key(&r.domain) {
        if let Some(f) = super::hosts_toml::find(&files.hosts_dirs, &r.domain) {
            return super::hosts_toml::endpoints(&f, r);
        }
        if let Some(eps) = super::registries_conf::endpoints(
            files.registries_conf.as_deref(),
            files.registries_conf_d.as_deref(),
            r,
        )? {
            return Ok(eps);
        }
    }
    let cfg = registries.get(&r.domain).cloned().unwrap_or_default();
    // An operator's file, read as a hosts.toml `ca` and every registry file is: a regular
    // file, bounded, symlinks followed (the certificates in /etc/ssl/certs are links).
    let ca = match &cfg.ca_file {
        Some(p) => read_config_file(p, 1 << 20)
            .map_err(|e| Error::Config(format!("registry {} ca_file: {e}", r.domain)))?
            .ok_or_else(|| {
                Error::Config(format!(
                    "registry {} ca_file {}: no such file",
                    r.domain,
                    p.display()
                ))
            })?
            .into_bytes(),
        None => Vec::new(),
    };
    let ep = |(plain_http, host, path): (bool, String, String)| Endpoint {
        host,
        plain_http,
        root: format!("{path}/v2"),
        repo: r.path.clone(),
        ca: ca.clone(),
        skip_verify: false,
    };
    let mut out: Vec<Endpoint> = cfg
        .mirrors
        .iter()
        .map(|m| {
            split_url(m).map(ep).ok_or_else(|| {
                Error::Config(format!(
                    "[registries.\"{}\"] mirror {m:?} is not a registry URL ([http[s]://]host[:port][/path])",
                    r.domain
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let host = api_host(&r.domain).to_string();
    out.push(ep((false, host.clone(), String::new())));
    if cfg.insecure || is_loopback(&r.domain) {
        out.push(ep((true, host, String::new())));
    }
    Ok(out)
}

/// Where a pull of `image` (each of a short name's candidates) would go, in order (`scheme://host[:port]<root>/<repo>`), and
/// whether each endpoint would get credentials: what the configuration and the files say,
/// with no network (the fuzz target's entry, `fuzz/fuzz_targets/registry_files.rs`).
#[doc(hidden)]
pub fn plan(
    image: &str,
    registries: &BTreeMap<String, RegistryConfig>,
    files: &RegistryFilesConfig,
    auth: &Auth,
) -> Result<Vec<(String, bool)>, Error> {
    let mut out = Vec::new();
    for r in super::short_names::candidates(image, &files.into())? {
        for ep in endpoints(&r, registries, files)? {
            let c = creds(auth, files, &ep, &r)?;
            out.push((format!("{}/{}", ep.url(), ep.repo), c.is_some()));
        }
    }
    Ok(out)
}

/// The credentials for endpoint `ep` of a pull of `r`: the request's, if it carries any
/// (only for the registry they were given for); else the global auth file's entry for the
/// endpoint's host.
pub(super) fn creds(
    auth: &Auth,
    files: &RegistryFilesConfig,
    ep: &Endpoint,
    r: &Reference,
) -> Result<Option<Creds>, Error> {
    if auth.creds().is_some() {
        return Ok(auth.for_endpoint(&ep.host, &r.domain));
    }
    match &files.global_auth_file {
        Some(f) => super::auth_file::creds_for(f, &ep.host),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_files_are_regular_files_read_through_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("registries.conf");
        std::fs::write(&f, "x = 1\n").unwrap();
        std::os::unix::fs::symlink(&f, t.path().join("link.conf")).unwrap();
        let read = |name: &str| read_config_file(&t.path().join(name), 64);
        assert_eq!(read("link.conf").unwrap().as_deref(), Some("x = 1\n"));
        assert_eq!(read("absent.conf").unwrap(), None);
        // A FIFO would block a reader that opened it plainly: refused at once.
        nix::unistd::mkfifo(&t.path().join("fifo.conf"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = read("fifo.conf").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::write(&f, "y".repeat(65)).unwrap();
        assert!(read("registries.conf")
            .unwrap_err()
            .to_string()
            .contains("over the limit"));
    }

    #[test]
    fn endpoints_mirrors_first_loopback_plain() {
        let mut regs = BTreeMap::new();
        regs.insert(
            "docker.io".to_string(),
            RegistryConfig {
                mirrors: vec![
                    "http://127.0.0.1:5001/".into(),
                    "mirror.example/cache".into(),
                ],
                ..Default::default()
            },
        );
        let none = RegistryFilesConfig {
            hosts_dirs: Vec::new(),
            registries_conf: None,
            registries_conf_d: None,
            global_auth_file: None,
            signature_policy: None,
        };
        let urls = |s: &str| -> Vec<String> {
            endpoints(&Reference::parse(s).unwrap(), &regs, &none)
                .unwrap()
                .iter()
                .map(|e| format!("{}/{}", e.url(), e.repo))
                .collect()
        };
        assert_eq!(
            urls("busybox"),
            vec![
                "http://127.0.0.1:5001/v2/library/busybox",
                "https://mirror.example/cache/v2/library/busybox",
                "https://registry-1.docker.io/v2/library/busybox"
            ]
        );
        assert_eq!(
            urls("127.0.0.1:5000/x:1"),
            vec!["https://127.0.0.1:5000/v2/x", "http://127.0.0.1:5000/v2/x"]
        );
        assert!(is_loopback("localhost:5000") && !is_loopback("example.com:5000"));
        assert_eq!(split_url("ftp://x"), None);
        regs.get_mut("docker.io")
            .unwrap()
            .mirrors
            .push("ftp://m.example".into());
        let e = endpoints(&Reference::parse("busybox").unwrap(), &regs, &none).unwrap_err();
        assert!(e.to_string().contains("ftp://m.example"), "{e}");
        assert_eq!(split_url("https://a b/"), None);
    }

    #[test]
    fn our_registries_first_then_hosts_toml_then_registries_conf() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("certs.d/example.com")).unwrap();
        std::fs::write(
            t.path().join("certs.d/example.com/hosts.toml"),
            "server = \"https://from-hosts-toml.example\"\n",
        )
        .unwrap();
        std::fs::write(
            t.path().join("registries.conf"),
            "[[registry]]\nprefix = \"example.com\"\nblocked = true\n[[registry]]\nprefix = \"example.org\"\nblocked = true\n",
        )
        .unwrap();
        let files = RegistryFilesConfig {
            hosts_dirs: vec![t.path().join("absent"), t.path().join("certs.d")],
            registries_conf: Some(t.path().join("registries.conf")),
            registries_conf_d: Some(t.path().join("absent.d")),
            global_auth_file: None,
            signature_policy: None,
        };
        let mut regs = BTreeMap::new();
        let first = |regs: &BTreeMap<String, RegistryConfig>, s: &str| {
            endpoints(&Reference::parse(s).unwrap(), regs, &files).map(|e| e[0].url())
        };
        assert_eq!(
            first(&regs, "example.com/x").unwrap(),
            "https://from-hosts-toml.example/v2"
        );
        assert!(matches!(
            first(&regs, "example.org/x"),
            Err(Error::PermissionDenied(_))
        ));
        assert_eq!(
            first(&regs, "example.net/x").unwrap(),
            "https://example.net/v2"
        );
        regs.insert("example.org".to_string(), RegistryConfig::default());
        assert_eq!(
            first(&regs, "example.org/x").unwrap(),
            "https://example.org/v2"
        );
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
