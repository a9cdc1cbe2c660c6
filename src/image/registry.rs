//! A registry client for pulls (the OCI distribution API over HTTP(S) with `reqwest`), written
//! for hostile peers: every response body is read with a bound (manifests, indexes and configs
//! a few MiB, error bodies 64 KiB, token answers 1 MiB, blobs exactly their descriptor's
//! size), every wait has a timeout, and credentials go only to the registry they were given
//! for. Basic and bearer-token authentication (the `WWW-Authenticate` challenge, the token
//! endpoint with the credentials, or a bearer token from the request used as is).

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::StatusCode;

/// Media types of manifests and indexes we accept, best first.
pub const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// Largest error body and token answer read.
const MAX_ERROR_BODY: usize = 64 << 10;
const MAX_TOKEN_BODY: usize = 1 << 20;

/// Why a registry call failed, with what the registry said.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Denied(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Transport(String),
}

/// Credentials for one registry (handed to a lazy layer's server on a pipe, never written).
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Creds {
    Basic(String, String),
    /// A token sent as is (CRI `registry_token`).
    Bearer(String),
}

impl std::fmt::Debug for Creds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Creds::Basic(u, _) => write!(f, "Basic({u:?}, ***)"),
            Creds::Bearer(_) => write!(f, "Bearer(***)"),
        }
    }
}

/// An authentication challenge (`WWW-Authenticate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub scheme: String,
    pub params: Vec<(String, String)>,
}

impl Challenge {
    fn param(&self, k: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
    }
}

/// Parses `Bearer realm="…",service="…",scope="…"` (quoted values may hold commas and
/// escaped quotes). Bounded: at most 32 parameters.
pub fn parse_challenge(h: &str) -> Option<Challenge> {
    let h = h.trim();
    let (scheme, rest) = h.split_once(char::is_whitespace).unwrap_or((h, ""));
    if scheme.is_empty() {
        return None;
    }
    let mut params = Vec::new();
    let b = rest.as_bytes();
    let mut i = 0;
    while i < b.len() && params.len() < 32 {
        while i < b.len() && (b[i] == b',' || b[i].is_ascii_whitespace()) {
            i += 1;
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && b[i] != b',' {
            i += 1;
        }
        let key = rest[start..i].trim().to_string();
        if i >= b.len() || b[i] != b'=' {
            break;
        }
        i += 1;
        let mut val = String::new();
        if i < b.len() && b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                val.push(b[i] as char);
                i += 1;
            }
            i += 1;
        } else {
            let s = i;
            while i < b.len() && b[i] != b',' {
                i += 1;
            }
            val = rest[s..i].trim().to_string();
        }
        if !key.is_empty() {
            params.push((key, val));
        }
    }
    Some(Challenge {
        scheme: scheme.to_string(),
        params,
    })
}

/// The API host of a registry domain (Docker Hub's is not its name).
pub fn api_host(domain: &str) -> &str {
    match domain {
        "docker.io" | "index.docker.io" => "registry-1.docker.io",
        d => d,
    }
}

/// One registry endpoint, for one repository.
pub struct Registry {
    client: reqwest::Client,
    /// The API's root: `https://host[:port]/v2` (or where a hosts.toml puts it).
    api: String,
    repo: String,
    creds: Option<Creds>,
    token: std::sync::Mutex<Option<String>>,
    /// What the client was made of (a lazy layer's server makes its own from them).
    endpoint: super::endpoints::Endpoint,
}

/// reqwest is built without a crypto provider of its own: ring becomes the process's
/// default unless the program embedding the library installed one first (then that one is
/// used). aws-lc, reqwest's own default, was the slowest step of a fresh build. A program
/// that builds reqwest clients of its own next to the library calls this first.
pub fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    });
}

/// An error with its causes, `outer: inner: …` (reqwest's own text drops them).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl Registry {
    /// The client of endpoint `ep` (its scheme, root, CA certificates trusted besides the
    /// system's, and whether any certificate is accepted) for `ep.repo`.
    pub fn new(
        ep: &super::endpoints::Endpoint,
        creds: Option<Creds>,
    ) -> Result<Registry, RegistryError> {
        install_tls_provider();
        let (host, plain_http, ca) = (ep.host.as_str(), ep.plain_http, ep.ca.as_slice());
        let base = || {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .read_timeout(Duration::from_secs(60))
                .redirect(reqwest::redirect::Policy::limited(5))
                .no_proxy()
                .tls_danger_accept_invalid_certs(ep.skip_verify)
                .user_agent(concat!("sandboxd/", env!("CARGO_PKG_VERSION")))
        };
        let certs = if ca.is_empty() {
            Vec::new()
        } else {
            reqwest::Certificate::from_pem_bundle(ca)
                .map_err(|e| RegistryError::Invalid(format!("CA file: {e}")))?
        };
        let client = match base().tls_certs_merge(certs.clone()).build() {
            Ok(c) => c,
            // The node's trust store could not be loaded (no ca-certificates): a plain-HTTP
            // registry needs none, a configured CA is enough on its own; otherwise say so.
            Err(e) if plain_http || !certs.is_empty() => {
                tracing::debug!(registry = host, error = %error_chain(&e), "no system CA roots; using only the configured ones");
                base()
                    .tls_certs_only(certs)
                    .build()
                    .map_err(|e| RegistryError::Transport(format!("HTTP client: {}", error_chain(&e))))?
            }
            Err(e) => {
                return Err(RegistryError::Transport(format!(
                    "HTTP client for {host}: the node's CA certificates could not be loaded ({}); install ca-certificates, or configure a CA or plain HTTP for this registry",
                    error_chain(&e)
                )))
            }
        };
        let token = match &creds {
            Some(Creds::Bearer(t)) => Some(t.clone()),
            _ => None,
        };
        Ok(Registry {
            client,
            api: ep.url(),
            repo: ep.repo.clone(),
            creds,
            token: std::sync::Mutex::new(token),
            endpoint: ep.clone(),
        })
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &super::endpoints::Endpoint {
        &self.endpoint
    }

    /// The credentials it was given.
    pub fn creds(&self) -> Option<&Creds> {
        self.creds.as_ref()
    }

    /// GET `url` (answering one authentication challenge), returning a successful response.
    async fn get(&self, url: &str, accept: &[&str]) -> Result<reqwest::Response, RegistryError> {
        self.get_range(url, accept, None).await
    }

    /// [`Registry::get`], asking for bytes `start..=end` only (the answer may be a 206 of
    /// them or, from a registry that ignores ranges, a 200 of the whole).
    async fn get_range(
        &self,
        url: &str,
        accept: &[&str],
        range: Option<(u64, u64)>,
    ) -> Result<reqwest::Response, RegistryError> {
        let mut answered = false;
        loop {
            let mut req = self.client.get(url);
            if !accept.is_empty() {
                req = req.header(ACCEPT, accept.join(", "));
            }
            if let Some((start, end)) = range {
                req = req.header(reqwest::header::RANGE, format!("bytes={start}-{end}"));
            }
            let auth = crate::state::lock(&self.token).clone();
            if let Some(t) = auth {
                req = req.header(AUTHORIZATION, format!("Bearer {t}"));
            } else if let (true, Some(Creds::Basic(u, p))) = (answered, &self.creds) {
                req = req.basic_auth(u, Some(p));
            }
            let resp = req.send().await.map_err(|e| transport(url, &e))?;
            if resp.status() == StatusCode::UNAUTHORIZED && !answered {
                answered = true;
                let ch = resp
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|h| h.to_str().ok())
                    .and_then(parse_challenge);
                match ch {
                    Some(c) if c.scheme.eq_ignore_ascii_case("bearer") => {
                        let t = self.fetch_token(&c).await?;
                        *crate::state::lock(&self.token) = Some(t);
                    }
                    Some(c) if c.scheme.eq_ignore_ascii_case("basic") => {
                        if !matches!(self.creds, Some(Creds::Basic(..))) {
                            return Err(RegistryError::Unauthenticated(format!(
                                "{url}: the registry wants credentials (basic auth)"
                            )));
                        }
                    }
                    _ => return Err(status_error(url, resp).await),
                }
                continue;
            }
            if !resp.status().is_success() {
                return Err(status_error(url, resp).await);
            }
            return Ok(resp);
        }
    }

    /// A bearer token from the challenge's realm, for pulling this repository.
    async fn fetch_token(&self, c: &Challenge) -> Result<String, RegistryError> {
        let realm = c.param("realm").ok_or_else(|| {
            RegistryError::Unauthenticated("bearer challenge without a realm".into())
        })?;
        let realm_url = reqwest::Url::parse(realm)
            .map_err(|e| RegistryError::Unauthenticated(format!("token realm {realm:?}: {e}")))?;
        if realm_url.scheme() != "https" && !self.api.starts_with("http://") {
            return Err(RegistryError::Unauthenticated(format!(
                "token realm {realm} is not HTTPS"
            )));
        }
        let scope = c
            .param("scope")
            .map(str::to_string)
            .unwrap_or_else(|| format!("repository:{}:pull", self.repo));
        let mut req = self
            .client
            .get(realm_url)
            .query(&[("scope", scope.as_str())]);
        if let Some(s) = c.param("service") {
            req = req.query(&[("service", s)]);
        }
        if let Some(Creds::Basic(u, p)) = &self.creds {
            req = req.basic_auth(u, Some(p));
        }
        let resp = req.send().await.map_err(|e| transport(realm, &e))?;
        if !resp.status().is_success() {
            let e = status_error(realm, resp).await;
            return Err(match e {
                RegistryError::Invalid(m) | RegistryError::NotFound(m) => {
                    RegistryError::Unauthenticated(m)
                }
                e => e,
            });
        }
        let body = read_capped(resp, MAX_TOKEN_BODY, realm).await?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| RegistryError::Unauthenticated(format!("token answer: {e}")))?;
        v.get("token")
            .or_else(|| v.get("access_token"))
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty() && t.len() < 64 * 1024)
            .map(str::to_string)
            .ok_or_else(|| RegistryError::Unauthenticated("token answer holds no token".into()))
    }

    /// A manifest or index by tag or digest: `(body, media type, its digest)`. A body over
    /// `max` bytes is refused; fetched by digest, it must match.
    pub async fn manifest(
        &self,
        reference: &str,
        max: usize,
    ) -> Result<(Bytes, String, String), RegistryError> {
        let url = format!("{}/{}/manifests/{reference}", self.api, self.repo);
        let resp = self.get(&url, MANIFEST_TYPES).await?;
        let media = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|h: &HeaderValue| h.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let body = read_capped(resp, max, &url).await?;
        let digest = super::store::sha256_of(&body);
        if reference.starts_with("sha256:") && reference != digest {
            return Err(RegistryError::Invalid(format!(
                "{url}: the registry sent content {digest}"
            )));
        }
        Ok((body, media, digest))
    }

    fn blob_url(&self, digest: &str) -> String {
        format!("{}/{}/blobs/{digest}", self.api, self.repo)
    }

    /// A small blob (a config) of at most `max` bytes, checked against its digest.
    pub async fn blob_bytes(&self, digest: &str, max: usize) -> Result<Bytes, RegistryError> {
        let url = self.blob_url(digest);
        let resp = self.get(&url, &[]).await?;
        let body = read_capped(resp, max, &url).await?;
        let got = super::store::sha256_of(&body);
        if got != digest {
            return Err(RegistryError::Invalid(format!(
                "{url}: the registry sent content {got}"
            )));
        }
        Ok(body)
    }

    /// A blob as a response to stream (the caller bounds and verifies it).
    pub async fn blob(&self, digest: &str) -> Result<reqwest::Response, RegistryError> {
        let url = self.blob_url(digest);
        self.get(&url, &[]).await
    }

    /// Bytes `start..=end` of a blob (a 206), or all of it (a 200) from a registry that
    /// ignores ranges.
    pub async fn blob_range(
        &self,
        digest: &str,
        start: u64,
        end: u64,
    ) -> Result<reqwest::Response, RegistryError> {
        let url = self.blob_url(digest);
        self.get_range(&url, &[], Some((start, end))).await
    }
}

fn transport(url: &str, e: &reqwest::Error) -> RegistryError {
    let mut s = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s = format!("{s}: {m}");
        }
        cur = c.source();
    }
    RegistryError::Transport(format!("{url}: {s}"))
}

/// Reads a body of at most `max` bytes (a declared or actual longer one is refused).
pub async fn read_capped(
    mut resp: reqwest::Response,
    max: usize,
    url: &str,
) -> Result<Bytes, RegistryError> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(RegistryError::Invalid(format!(
            "{url}: {} bytes, over the limit of {max}",
            resp.content_length().unwrap_or(0)
        )));
    }
    let mut out = bytes::BytesMut::new();
    while let Some(c) = resp.chunk().await.map_err(|e| transport(url, &e))? {
        if out.len() + c.len() > max {
            return Err(RegistryError::Invalid(format!(
                "{url}: more than the limit of {max} bytes"
            )));
        }
        out.extend_from_slice(&c);
    }
    Ok(out.freeze())
}

/// The error a failed response stands for, with the registry's own message (its body read
/// with a bound).
async fn status_error(url: &str, resp: reqwest::Response) -> RegistryError {
    let status = resp.status();
    let body = read_capped(resp, MAX_ERROR_BODY, url)
        .await
        .unwrap_or_default();
    let detail = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v["errors"].as_array().map(|errs| {
                errs.iter()
                    .map(|e| {
                        format!(
                            "{}: {}",
                            e["code"].as_str().unwrap_or(""),
                            e["message"].as_str().unwrap_or("")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            })
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            String::from_utf8_lossy(&body[..body.len().min(512)])
                .trim()
                .to_string()
        });
    let msg = format!("{url}: {status}: {detail}");
    match status {
        StatusCode::NOT_FOUND => RegistryError::NotFound(msg),
        StatusCode::UNAUTHORIZED => RegistryError::Unauthenticated(msg),
        StatusCode::FORBIDDEN => RegistryError::Denied(msg),
        s if s.is_client_error() => RegistryError::Invalid(msg),
        _ => RegistryError::Transport(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "Bearer");
        assert_eq!(c.param("realm"), Some("https://auth.example/token"));
        assert_eq!(c.param("scope"), Some("repository:a/b:pull,push"));
        let c = parse_challenge(r#"Basic realm="Registry \"x\"""#).unwrap();
        assert_eq!(
            (c.scheme.as_str(), c.param("realm")),
            ("Basic", Some("Registry \"x\""))
        );
        assert!(parse_challenge("").is_none());
        // Garbage never panics and stays bounded.
        let junk = "Bearer ".to_string() + &"a=b,".repeat(10_000);
        assert_eq!(parse_challenge(&junk).unwrap().params.len(), 32);
        assert_eq!(api_host("docker.io"), "registry-1.docker.io");
    }

    #[test]
    fn credentials_are_not_printed() {
        let c = Creds::Basic("u".into(), "secret".into());
        assert!(!format!("{c:?}").contains("secret"));
        assert!(!format!("{:?}", Creds::Bearer("tok".into())).contains("tok"));
    }
}
