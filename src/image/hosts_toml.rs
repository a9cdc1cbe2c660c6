//! containerd's registry host files, as operators keep them for containerd's `config_path`
//! (and Docker's `certs.d`): `<dir>/<host[:port]>/hosts.toml`, else `<dir>/_default/
//! hosts.toml`. The `[host."URL"]` tables are tried in the file's order, then the upstream
//! `server` (default `https://<host>`), each with its own `capabilities`, `ca` (a path or a
//! list, relative to the file's dir), `skip_verify` and `override_path` (the URL's path is the
//! API root instead of `<path>/v2`). `client` certificates and `header`s are refused by name
//! rather than ignored: a pull that silently lacked them would fail in a way the file's
//! owner could not tell from the file.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::endpoints::{read_config_file, split_url, Endpoint};
use super::reference::Reference;
use crate::error::Error;

/// Largest hosts.toml and CA file read.
const MAX_FILE: u64 = 1 << 20;
/// Most `[host]` tables used from one file.
const MAX_HOSTS: usize = 32;

/// The settings of one host: the file's top level (for `server`) or a `[host."URL"]` table.
#[derive(Debug, Default, Deserialize)]
struct HostFields {
    capabilities: Option<Vec<String>>,
    ca: Option<OneOrMany>,
    skip_verify: Option<bool>,
    override_path: Option<bool>,
    client: Option<toml::Value>,
    header: Option<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// The hosts.toml that speaks for `domain`: the first `<dir>/<domain>/hosts.toml` of `dirs`,
/// else the first `<dir>/_default/hosts.toml`.
pub(super) fn find(dirs: &[PathBuf], domain: &str) -> Option<PathBuf> {
    // A registry name is `host[:port]`; anything else (a path) never names a dir.
    if domain.contains('/') || domain.starts_with('.') || domain.is_empty() {
        return None;
    }
    [domain, "_default"].iter().find_map(|name| {
        dirs.iter()
            .map(|d| d.join(name).join("hosts.toml"))
            .find(|p| p.is_file())
    })
}

/// The endpoints `file` gives for a pull of `r`, in order: its hosts that may serve this
/// pull (`resolve` for a tag, `pull` for a digest), then `server`.
pub(super) fn endpoints(file: &Path, r: &Reference) -> Result<Vec<Endpoint>, Error> {
    let shown = file.display();
    let bad = |why: String| Error::Config(format!("{shown}: {why}"));
    let text =
        read_config_file(file, MAX_FILE)?.ok_or_else(|| bad("vanished while being read".into()))?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let server = match table.remove("server") {
        Some(toml::Value::String(s)) => Some(s),
        Some(_) => return Err(bad("`server` is not a string".into())),
        None => None,
    };
    let hosts = match table.remove("host") {
        Some(toml::Value::Table(t)) => t,
        Some(_) => return Err(bad("`host` is not a table".into())),
        None => toml::Table::new(),
    };
    if hosts.len() > MAX_HOSTS {
        return Err(bad(format!(
            "{} hosts, more than the {MAX_HOSTS} read",
            hosts.len()
        )));
    }
    let top: HostFields = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| bad(e.to_string()))?;
    let dir = file.parent().unwrap_or(Path::new("/"));
    let mut out = Vec::new();
    for (url, v) in hosts {
        let f: HostFields = v
            .try_into()
            .map_err(|e: toml::de::Error| bad(format!("host {url:?}: {e}")))?;
        if let Some(ep) =
            endpoint(&url, &f, dir, r).map_err(|w| bad(format!("host {url:?}: {w}")))?
        {
            out.push(ep);
        }
    }
    let server =
        server.unwrap_or_else(|| format!("https://{}", super::registry::api_host(&r.domain)));
    if let Some(ep) =
        endpoint(&server, &top, dir, r).map_err(|w| bad(format!("server {server:?}: {w}")))?
    {
        out.push(ep);
    }
    Ok(out)
}

/// One host's endpoint, or None when its capabilities do not cover this pull.
fn endpoint(
    url: &str,
    f: &HostFields,
    dir: &Path,
    r: &Reference,
) -> Result<Option<Endpoint>, String> {
    if f.client.is_some() {
        return Err("client certificates (`client`) are not supported by sandboxd".into());
    }
    if f.header.is_some() {
        return Err("request headers (`header`) are not supported by sandboxd".into());
    }
    let caps = f.capabilities.as_deref();
    let can = |c: &str| caps.is_none_or(|caps| caps.iter().any(|x| x == c));
    // A tag is resolved to a digest by a host that may `resolve`; by digest, `pull` is enough.
    if !can("pull") || (r.digest.is_none() && !can("resolve")) {
        return Ok(None);
    }
    let (plain_http, host, path) = split_url(url).ok_or("not a URL of a registry")?;
    let root = if f.override_path.unwrap_or(false) || path.ends_with("/v2") {
        path
    } else {
        format!("{path}/v2")
    };
    let mut ca = Vec::new();
    let files = match &f.ca {
        None => Vec::new(),
        Some(OneOrMany::One(p)) => vec![p.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
    };
    for p in files {
        let p = dir.join(p);
        let pem = read_config_file(&p, MAX_FILE)
            .map_err(|e| format!("ca {}: {e}", p.display()))?
            .ok_or_else(|| format!("ca {}: no such file", p.display()))?;
        ca.extend_from_slice(pem.as_bytes());
        ca.push(b'\n');
    }
    Ok(Some(Endpoint {
        host,
        plain_http,
        root,
        repo: r.path.clone(),
        ca,
        skip_verify: f.skip_verify.unwrap_or(false),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, host: &str, text: &str) -> PathBuf {
        let d = dir.join(host);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("hosts.toml"), text).unwrap();
        d.join("hosts.toml")
    }

    #[test]
    fn hosts_in_file_order_then_server_by_capability() {
        let t = tempfile::tempdir().unwrap();
        let f = write(
            t.path(),
            "registry.example:5000",
            r#"
server = "https://registry.example:5000"
skip_verify = true

[host."https://zz-mirror.example/cache"]
  capabilities = ["pull", "resolve"]
  ca = "mirror.pem"

[host."http://aa-mirror.example:8080/custom/api"]
  capabilities = ["pull", "resolve"]
  override_path = true

[host."https://digests-only.example"]
  capabilities = ["pull"]
"#,
        );
        std::fs::write(t.path().join("registry.example:5000/mirror.pem"), "PEM").unwrap();
        assert_eq!(
            find(&[t.path().into()], "registry.example:5000"),
            Some(f.clone())
        );
        assert_eq!(find(&[t.path().into()], "other.example"), None);
        let r = Reference::parse("registry.example:5000/team/app:1").unwrap();
        let eps = endpoints(&f, &r).unwrap();
        let got: Vec<_> = eps
            .iter()
            .map(|e| (e.url(), e.skip_verify, e.ca.starts_with(b"PEM")))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "https://zz-mirror.example/cache/v2".to_string(),
                    false,
                    true
                ),
                (
                    "http://aa-mirror.example:8080/custom/api".to_string(),
                    false,
                    false
                ),
                ("https://registry.example:5000/v2".to_string(), true, false),
            ]
        );
        // By digest, the pull-only host serves too.
        let r = Reference::parse(&format!(
            "registry.example:5000/team/app@sha256:{}",
            "a".repeat(64)
        ))
        .unwrap();
        assert_eq!(endpoints(&f, &r).unwrap().len(), 4);
    }

    #[test]
    fn default_dir_default_server_and_refusals() {
        let t = tempfile::tempdir().unwrap();
        let f = write(t.path(), "_default", "");
        assert_eq!(find(&[t.path().into()], "docker.io"), Some(f.clone()));
        assert_eq!(find(&[t.path().into()], "../x"), None);
        let r = Reference::parse("busybox").unwrap();
        let eps = endpoints(&f, &r).unwrap();
        assert_eq!(eps.len(), 1);
        assert_eq!(eps[0].url(), "https://registry-1.docker.io/v2");
        assert_eq!(eps[0].repo, "library/busybox");

        for (host, text, says) in [
            (
                "a.example",
                "[host.\"https://m.example\"]\nclient = \"c.pem\"\n",
                "client certificates",
            ),
            (
                "b.example",
                "[host.\"https://m.example\"]\nca = \"absent.pem\"\n",
                "absent.pem",
            ),
            ("c.example", "server = 3\n", "`server`"),
        ] {
            let f = write(t.path(), host, text);
            let e = endpoints(&f, &Reference::parse(&format!("{host}/x")).unwrap()).unwrap_err();
            assert!(
                e.to_string().contains(says) && e.to_string().contains("hosts.toml"),
                "{e}"
            );
        }
    }
}
