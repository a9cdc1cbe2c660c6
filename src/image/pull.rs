//! PullImage from an OCI/Docker registry with `oci-client`: the configured mirrors first,
//! then the registry itself; basic and bearer-token auth from the request; HTTP only for
//! registries configured `insecure` (and loopback ones, as Docker does). Layers go through
//! the store (digest verified, unpacked once); blobs already stored are not downloaded again.

use std::collections::BTreeMap;
use std::path::PathBuf;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use serde::{Deserialize, Serialize};

use super::reference::Reference;
use super::{ImageRecord, ImageStore};
use crate::error::{Error, HostError, Result};

/// Per-registry settings (`[registries."host:port"]` in the config file).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RegistryConfig {
    /// Endpoints tried before the registry itself, e.g. `http://127.0.0.1:5001` or
    /// `https://mirror.example`; the repository path is kept.
    pub mirrors: Vec<String>,
    /// Plain HTTP allowed: HTTPS is tried first, then HTTP (as Docker does for insecure
    /// registries; loopback registries are treated as insecure).
    pub insecure: bool,
    /// A PEM file of CA certificates trusted for this registry and its mirrors (besides the
    /// system's roots).
    pub ca_file: Option<PathBuf>,
}

/// Credentials from the request (CRI `AuthConfig`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Auth {
    pub username: String,
    pub password: String,
    /// A registry (bearer) token used as is.
    pub registry_token: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Auth {{ username: {:?}, .. }}", self.username)
    }
}

impl Auth {
    fn registry_auth(&self) -> RegistryAuth {
        if !self.registry_token.is_empty() {
            RegistryAuth::Bearer(self.registry_token.clone())
        } else if !self.username.is_empty() {
            RegistryAuth::Basic(self.username.clone(), self.password.clone())
        } else {
            RegistryAuth::Anonymous
        }
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
fn endpoints(r: &Reference, registries: &BTreeMap<String, RegistryConfig>) -> Vec<(String, bool)> {
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
    out.push((r.domain.clone(), false));
    if cfg.insecure || is_loopback(&r.domain) {
        out.push((r.domain.clone(), true));
    }
    out
}

/// Pulls `image` into `store`, tagging it with the normalized reference.
pub async fn pull(
    store: &ImageStore,
    image: &str,
    auth: &Auth,
    registries: &BTreeMap<String, RegistryConfig>,
) -> Result<ImageRecord> {
    let r = Reference::parse(image)?;
    let mut certs = Vec::new();
    if let Some(ca) = registries.get(&r.domain).and_then(|c| c.ca_file.as_ref()) {
        let data = std::fs::read(ca).map_err(|e| HostError::io("read CA file", ca, e))?;
        certs.push(oci_client::client::Certificate {
            encoding: oci_client::client::CertificateEncoding::Pem,
            data,
        });
    }
    let mut errors = Vec::new();
    for (host, http) in endpoints(&r, registries) {
        match pull_from(store, &r, &host, http, auth, &certs).await {
            Ok(rec) => return Ok(rec),
            Err(e) => {
                tracing::warn!(image = %r.full(), endpoint = %host, error = %e, "pull from endpoint failed");
                let scheme = if http { "http" } else { "https" };
                errors.push(format!("{scheme}://{host}: {e}"));
            }
        }
    }
    Err(Error::Host(HostError::Other(errors.join("; "))))
}

/// An error with its causes (reqwest hides TLS and connection errors in its sources).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s = format!("{s}: {m}");
        }
        cur = c.source();
    }
    s
}

async fn pull_from(
    store: &ImageStore,
    r: &Reference,
    host: &str,
    http: bool,
    auth: &Auth,
    certs: &[oci_client::client::Certificate],
) -> std::result::Result<ImageRecord, String> {
    let protocol = if http {
        ClientProtocol::HttpsExcept(vec![host.to_string()])
    } else {
        ClientProtocol::Https
    };
    let client = oci_client::Client::new(ClientConfig {
        protocol,
        connect_timeout: Some(std::time::Duration::from_secs(10)),
        read_timeout: Some(std::time::Duration::from_secs(60)),
        extra_root_certificates: certs.to_vec(),
        ..Default::default()
    });
    let oref = match (&r.tag, &r.digest) {
        (_, Some(d)) => oci_client::Reference::with_digest(host.into(), r.path.clone(), d.clone()),
        (Some(t), None) => oci_client::Reference::with_tag(host.into(), r.path.clone(), t.clone()),
        (None, None) => {
            oci_client::Reference::with_tag(host.into(), r.path.clone(), "latest".into())
        }
    };
    let auth = auth.registry_auth();
    let (manifest, manifest_digest, config, list_digest) = client
        .pull_manifest_and_config_and_list_digest(&oref, &auth)
        .await
        .map_err(|e| chain(&e))?;
    let config_bytes = config.into_bytes();
    let config_digest = manifest.config.digest.clone();
    let mut size = store
        .put_blob(&config_digest, &mut &config_bytes[..])
        .map_err(|e| e.to_string())?;
    let tmp = store
        .dir
        .join("tmp")
        .join(format!("pull-{}", &crate::validate::new_id()[..16]));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("create {}: {e}", tmp.display()))?;
    let result = async {
        let mut blobs: Vec<PathBuf> = Vec::new();
        for layer in &manifest.layers {
            let dest = store.blob_path(&layer.digest).map_err(|e| e.to_string())?;
            if !dest.exists() {
                let part = tmp.join(layer.digest.replace(':', "-"));
                let mut f = tokio::fs::File::create(&part)
                    .await
                    .map_err(|e| format!("create {}: {e}", part.display()))?;
                client
                    .pull_blob(&oref, layer, &mut f)
                    .await
                    .map_err(|e| format!("layer {}: {}", layer.digest, chain(&e)))?;
                drop(f);
                store
                    .adopt_blob(&layer.digest, &part)
                    .map_err(|e| e.to_string())?;
            }
            size += std::fs::metadata(&dest).map(|m| m.len()).unwrap_or(0);
            blobs.push(dest);
        }
        // The digest the tag resolves to: the index's when the registry serves one.
        let repo_digest = list_digest.unwrap_or(manifest_digest);
        store
            .register(
                &config_bytes,
                &config_digest,
                &blobs,
                size,
                Some(&r.full()),
                Some(&repo_digest),
            )
            .map_err(|e| e.to_string())
    }
    .await;
    let _ = std::fs::remove_dir_all(&tmp);
    result
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
                ("docker.io".to_string(), false)
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
}
