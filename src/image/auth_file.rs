//! A docker `config.json` of registry credentials (CRI-O's `global_auth_file`, kubelet's
//! own file, `docker login`'s output): `{"auths": {"<host>": {"auth": base64("user:pass")}}}`,
//! or `username` and `password`, or a `registrytoken`. Keys are `host[:port]`, optionally as
//! a URL (`https://index.docker.io/v1/` is Docker Hub). Used for a pull whose request
//! carries no credentials; each entry goes only to the endpoint host it is keyed by.

use std::path::Path;

use base64::Engine;
use serde::Deserialize;

use super::endpoints::read_config_file;
use super::registry::{api_host, Creds};
use crate::error::Error;

/// Largest file read.
const MAX_FILE: u64 = 1 << 20;

#[derive(Debug, Default, Deserialize)]
struct File {
    #[serde(default)]
    auths: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct Entry {
    #[serde(default)]
    auth: String,
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    registrytoken: String,
}

/// `host[:port]` of a key (`https://host/v1/` → `host`), as the registry API is reached.
fn key_host(key: &str) -> String {
    let k = key.split_once("://").map_or(key, |(_, rest)| rest);
    let k = k.split('/').next().unwrap_or(k).to_ascii_lowercase();
    let k = if k == "index.docker.io" {
        "docker.io".into()
    } else {
        k
    };
    api_host(&k).to_string()
}

/// The credentials `file` holds for endpoint `host` (None: no file, or no entry for it).
pub(super) fn creds_for(file: &Path, host: &str) -> Result<Option<Creds>, Error> {
    let bad = |why: String| Error::Config(format!("{}: {why}", file.display()));
    let Some(text) = read_config_file(file, MAX_FILE)? else {
        return Ok(None);
    };
    let parsed: File = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let want = api_host(&host.to_ascii_lowercase()).to_string();
    let Some((key, v)) = parsed.auths.iter().find(|(k, _)| key_host(k) == want) else {
        return Ok(None);
    };
    let e: Entry =
        serde_json::from_value(v.clone()).map_err(|e| bad(format!("auths {key:?}: {e}")))?;
    if !e.registrytoken.is_empty() {
        return Ok(Some(Creds::Bearer(e.registrytoken)));
    }
    if !e.auth.is_empty() {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(e.auth.trim())
            .map_err(|e| bad(format!("auths {key:?}: auth is not base64: {e}")))?;
        let s =
            String::from_utf8(raw).map_err(|_| bad(format!("auths {key:?}: auth is not UTF-8")))?;
        let (u, p) = s
            .split_once(':')
            .ok_or_else(|| bad(format!("auths {key:?}: auth is not user:password")))?;
        return Ok(Some(Creds::Basic(u.to_string(), p.to_string())));
    }
    if !e.username.is_empty() {
        return Ok(Some(Creds::Basic(e.username, e.password)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_by_host_in_every_form() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("config.json");
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:pa:ss");
        std::fs::write(
            &f,
            format!(
                r#"{{"auths": {{
                    "https://index.docker.io/v1/": {{"auth": "{b64}"}},
                    "127.0.0.1:5000": {{"username": "bob", "password": "pw"}},
                    "https://mirror.example/some/path": {{"registrytoken": "tok"}},
                    "broken.example": {{"auth": "%%%"}}
                }}, "credHelpers": {{}}}}"#
            ),
        )
        .unwrap();
        assert_eq!(
            creds_for(&f, "registry-1.docker.io").unwrap(),
            Some(Creds::Basic("alice".into(), "pa:ss".into()))
        );
        assert_eq!(
            creds_for(&f, "127.0.0.1:5000").unwrap(),
            Some(Creds::Basic("bob".into(), "pw".into()))
        );
        assert_eq!(
            creds_for(&f, "MIRROR.example").unwrap(),
            Some(Creds::Bearer("tok".into()))
        );
        assert_eq!(creds_for(&f, "127.0.0.1:5001").unwrap(), None);
        let e = creds_for(&f, "broken.example").unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("base64"), "{e}");
        assert_eq!(creds_for(&t.path().join("absent"), "x").unwrap(), None);
        std::fs::write(&f, "{").unwrap();
        assert!(creds_for(&f, "x").is_err());
    }
}
