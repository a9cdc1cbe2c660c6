//! Image signature policy: the `containers-policy.json` CRI-O reads (`[registry_files]
//! signature_policy`, default `/etc/containers/policy.json`), for pulls over the `docker`
//! transport. Served: `insecureAcceptAnything`, `reject`, and `sigstoreSigned` with public
//! keys (`keyPath`, `keyPaths`, `keyData`, `keyDatas`; ECDSA P-256/P-384, Ed25519, RSA) and
//! `signedIdentity` (`matchRepoDigestOrExact` by default, `matchExact`, `matchRepository`,
//! `exactReference`, `exactRepository`). A requirement we cannot check (`signedBy` GPG keys,
//! Fulcio certificates, Rekor, `remapIdentity`) fails the pulls of its scope naming it: never
//! an image accepted by a rule read as looser than written.
//!
//! Signatures are cosign's: the manifest tagged `sha256-<hex>.sig` in the image's repository
//! at the endpoint the image comes from, one layer per signature whose blob is the "simple
//! signing" payload and whose annotation `dev.cosignproject.cosign/signature` is the
//! signature over it. They are checked against the digest the reference resolved to (the
//! index's, for a multi-platform image), before any layer is fetched.
//!
//! Bounded: the file ≤ 1 MiB and 1024 scopes, ≤ 32 keys per requirement (each file ≤ 64 KiB),
//! ≤ 64 signatures per image, a payload ≤ 64 KiB, a signature ≤ 4 KiB.

use std::path::{Path, PathBuf};

use base64::Engine;
use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use serde::Deserialize;
use serde_json::Value;

use super::reference::Reference;
use super::registry::{Registry, RegistryError};
use crate::error::Error;

const MAX_FILE: u64 = 1 << 20;
const MAX_SCOPES: usize = 1024;
const MAX_KEYS: usize = 32;
const MAX_KEY_FILE: u64 = 64 << 10;
const MAX_SIGNATURES: usize = 64;
const MAX_PAYLOAD: usize = 64 << 10;
const MAX_SIGNATURE: usize = 4 << 10;
const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";

/// A parsed policy file.
#[derive(Debug)]
pub struct Policy {
    source: PathBuf,
    default: Vec<Req>,
    /// `transports.docker`: scope → requirements (`""`: the transport's default).
    docker: Vec<(String, Vec<Req>)>,
}

/// One requirement of a scope (all of a scope's must be met).
#[derive(Debug, Clone)]
pub enum Req {
    Accept,
    Reject,
    Sigstore {
        keys: Vec<Key>,
        identity: Identity,
    },
    /// What we cannot check, with what it is.
    Unsupported(String),
}

/// A public key a signature may verify with.
#[derive(Clone)]
pub struct Key {
    alg: &'static dyn VerificationAlgorithm,
    /// The key as ring takes it: an EC point, an Ed25519 key or an RSAPublicKey.
    raw: Vec<u8>,
    /// ASN.1 DER ECDSA signatures also come as fixed-size `r||s`.
    fixed: Option<&'static dyn VerificationAlgorithm>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({:?})", self.alg)
    }
}

/// What the signature must claim about the image's name.
#[derive(Debug, Clone, PartialEq)]
pub enum Identity {
    MatchExact,
    MatchRepoDigestOrExact,
    MatchRepository,
    ExactReference(String),
    ExactRepository(String),
}

/// What a pull must do to satisfy the policy.
#[derive(Debug)]
pub enum Verdict {
    Accept,
    /// Refused without asking a registry (the message names the scope and file).
    Refuse(String),
    /// Verify signatures with these requirements (scope, file for the message).
    Verify {
        reqs: Vec<Req>,
        scope: String,
        source: PathBuf,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    default: Vec<Value>,
    #[serde(default)]
    transports: std::collections::BTreeMap<String, std::collections::BTreeMap<String, Vec<Value>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSigstore {
    #[serde(rename = "type")]
    _type: String,
    key_path: Option<String>,
    key_paths: Option<Vec<String>>,
    key_data: Option<String>,
    key_datas: Option<Vec<String>>,
    fulcio: Option<Value>,
    rekor_public_key_path: Option<Value>,
    rekor_public_key_paths: Option<Value>,
    rekor_public_key_data: Option<Value>,
    rekor_public_key_datas: Option<Value>,
    pki: Option<Value>,
    signed_identity: Option<Value>,
}

/// Reads the policy file; `Ok(None)` when there is none (every image accepted, as with
/// containerd).
pub fn load(path: Option<&Path>) -> Result<Option<Policy>, Error> {
    let Some(path) = path else { return Ok(None) };
    let Some(text) = super::endpoints::read_config_file(path, MAX_FILE)? else {
        return Ok(None);
    };
    parse(&text, path)
        .map(Some)
        .map_err(|m| Error::Config(format!("{}: {m}", path.display())))
}

/// Parses a policy file's text (`source` names it in messages and anchors nothing else).
pub fn parse(text: &str, source: &Path) -> Result<Policy, String> {
    let raw: RawPolicy = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if raw.default.is_empty() {
        return Err("\"default\" lists no requirement (write [{\"type\": \"reject\"}] to refuse every image)".into());
    }
    let default = reqs(&raw.default, "default")?;
    let mut docker = Vec::new();
    for (transport, scopes) in &raw.transports {
        if scopes.len() > MAX_SCOPES {
            return Err(format!(
                "transports.{transport}: more than {MAX_SCOPES} scopes"
            ));
        }
        // Pulls go over the docker transport only; the other transports' scopes are checked
        // for form and otherwise left alone.
        for (scope, list) in scopes {
            let what = format!("transports.{transport}.{scope:?}");
            if list.is_empty() {
                return Err(format!("{what} lists no requirement"));
            }
            let parsed = reqs(list, &what)?;
            if transport == "docker" {
                if !scope.is_empty() {
                    check_scope(scope).map_err(|m| format!("{what}: {m}"))?;
                }
                docker.push((scope.clone(), parsed));
            }
        }
    }
    Ok(Policy {
        source: source.to_path_buf(),
        default,
        docker,
    })
}

fn check_scope(scope: &str) -> Result<(), String> {
    if let Some(rest) = scope.strip_prefix("*.") {
        if rest.is_empty() || rest.contains(['/', '*', '@', ':']) {
            return Err("a wildcard scope is *.DOMAIN, nothing after the domain".into());
        }
        return Ok(());
    }
    if scope.contains('*') || scope.ends_with('/') || scope.contains("//") {
        return Err("expected HOST[/NAMESPACE…][/REPO[:TAG|@DIGEST]] or *.DOMAIN".into());
    }
    Ok(())
}

fn reqs(list: &[Value], what: &str) -> Result<Vec<Req>, String> {
    list.iter()
        .enumerate()
        .map(|(i, v)| req(v).map_err(|m| format!("{what}[{i}]: {m}")))
        .collect()
}

fn req(v: &Value) -> Result<Req, String> {
    let typ = v["type"].as_str().ok_or("no \"type\"")?;
    let only_type = || match v.as_object().map(|o| o.len()) {
        Some(1) => Ok(()),
        _ => Err(format!("{typ} takes no other field")),
    };
    match typ {
        "insecureAcceptAnything" => only_type().map(|_| Req::Accept),
        "reject" => only_type().map(|_| Req::Reject),
        "signedBy" => Ok(Req::Unsupported(
            "signedBy (GPG signatures) is not served; use sigstoreSigned".into(),
        )),
        "sigstoreSigned" => sigstore(v),
        other => Err(format!("unknown requirement type {other:?}")),
    }
}

fn sigstore(v: &Value) -> Result<Req, String> {
    let raw: RawSigstore = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    for (set, name) in [
        (raw.fulcio.is_some(), "fulcio"),
        (raw.pki.is_some(), "pki"),
        (
            raw.rekor_public_key_path.is_some()
                || raw.rekor_public_key_paths.is_some()
                || raw.rekor_public_key_data.is_some()
                || raw.rekor_public_key_datas.is_some(),
            "rekorPublicKey*",
        ),
    ] {
        if set {
            return Ok(Req::Unsupported(format!(
                "sigstoreSigned with {name} is not served (public keys only)"
            )));
        }
    }
    let mut pems: Vec<(String, Vec<u8>)> = Vec::new();
    let paths = raw.key_path.iter().chain(raw.key_paths.iter().flatten());
    for p in paths {
        if pems.len() >= MAX_KEYS {
            return Err(format!("more than {MAX_KEYS} keys"));
        }
        let text = super::endpoints::read_config_file(Path::new(p), MAX_KEY_FILE)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("keyPath {p}: no such file"))?;
        pems.push((p.clone(), text.into_bytes()));
    }
    for d in raw.key_data.iter().chain(raw.key_datas.iter().flatten()) {
        if pems.len() >= MAX_KEYS {
            return Err(format!("more than {MAX_KEYS} keys"));
        }
        let b = base64::engine::general_purpose::STANDARD
            .decode(d)
            .map_err(|e| format!("keyData: not base64: {e}"))?;
        pems.push(("keyData".into(), b));
    }
    if pems.is_empty() {
        return Err("sigstoreSigned names no key (keyPath, keyPaths, keyData or keyDatas)".into());
    }
    let keys = pems
        .iter()
        .map(|(what, pem)| key_from_pem(pem).map_err(|m| format!("{what}: {m}")))
        .collect::<Result<Vec<_>, _>>()?;
    let identity = match &raw.signed_identity {
        None => Identity::MatchRepoDigestOrExact,
        Some(i) => match identity(i)? {
            Some(i) => i,
            None => {
                return Ok(Req::Unsupported(
                    "signedIdentity remapIdentity is not served".into(),
                ))
            }
        },
    };
    Ok(Req::Sigstore { keys, identity })
}

fn identity(v: &Value) -> Result<Option<Identity>, String> {
    let typ = v["type"].as_str().ok_or("signedIdentity: no \"type\"")?;
    let fields = v.as_object().map_or(0, |o| o.len());
    let arg = |k: &str| -> Result<String, String> {
        match (v[k].as_str(), fields) {
            (Some(s), 2) => Reference::parse(s)
                .map(|_| s.to_string())
                .map_err(|e| format!("signedIdentity {typ}: {e}")),
            _ => Err(format!("signedIdentity {typ} takes exactly {k:?}")),
        }
    };
    let none = |i: Identity| match fields {
        1 => Ok(Some(i)),
        _ => Err(format!("signedIdentity {typ} takes no other field")),
    };
    match typ {
        "matchExact" => none(Identity::MatchExact),
        "matchRepoDigestOrExact" => none(Identity::MatchRepoDigestOrExact),
        "matchRepository" => none(Identity::MatchRepository),
        "exactReference" => arg("dockerReference").map(|s| Some(Identity::ExactReference(s))),
        "exactRepository" => arg("dockerRepository").map(|s| Some(Identity::ExactRepository(s))),
        "remapIdentity" => Ok(None),
        other => Err(format!("unknown signedIdentity type {other:?}")),
    }
}

/// A PEM `PUBLIC KEY` (SubjectPublicKeyInfo), as `cosign generate-key-pair` writes it.
fn key_from_pem(pem: &[u8]) -> Result<Key, String> {
    use rustls_pki_types::pem::PemObject;
    use spki::der::Decode;
    let der = rustls_pki_types::SubjectPublicKeyInfoDer::from_pem_slice(pem)
        .map_err(|e| format!("not a PEM public key: {e}"))?;
    let info = spki::SubjectPublicKeyInfoRef::from_der(der.as_ref())
        .map_err(|e| format!("not a SubjectPublicKeyInfo: {e}"))?;
    let raw = info
        .subject_public_key
        .as_bytes()
        .ok_or("the key's bit string is not whole bytes")?
        .to_vec();
    let oid = info.algorithm.oid.to_string();
    let param = info
        .algorithm
        .parameters
        .and_then(|p| p.decode_as::<spki::ObjectIdentifier>().ok())
        .map(|o| o.to_string());
    let (alg, fixed): (&'static dyn VerificationAlgorithm, _) =
        match (oid.as_str(), param.as_deref()) {
            ("1.2.840.10045.2.1", Some("1.2.840.10045.3.1.7")) => (
                &signature::ECDSA_P256_SHA256_ASN1,
                Some(&signature::ECDSA_P256_SHA256_FIXED as &dyn VerificationAlgorithm),
            ),
            ("1.2.840.10045.2.1", Some("1.3.132.0.34")) => (
                &signature::ECDSA_P384_SHA384_ASN1,
                Some(&signature::ECDSA_P384_SHA384_FIXED as &dyn VerificationAlgorithm),
            ),
            ("1.3.101.112", _) => (&signature::ED25519, None),
            ("1.2.840.113549.1.1.1", _) => (&signature::RSA_PKCS1_2048_8192_SHA256, None),
            (o, p) => return Err(format!("key algorithm {o} ({p:?}) is not served")),
        };
    Ok(Key { alg, raw, fixed })
}

impl Key {
    fn verifies(&self, payload: &[u8], sig: &[u8]) -> bool {
        UnparsedPublicKey::new(self.alg, &self.raw)
            .verify(payload, sig)
            .is_ok()
            || self.fixed.is_some_and(|f| {
                UnparsedPublicKey::new(f, &self.raw)
                    .verify(payload, sig)
                    .is_ok()
            })
    }
}

impl Policy {
    /// The requirements for `r`: the most specific `docker` scope that matches (the image,
    /// its repository, each namespace above it, its host, then `*.domain` wildcards), else
    /// the transport's `""`, else `default`.
    pub fn for_image(&self, r: &Reference) -> (String, &[Req]) {
        for scope in scopes(r) {
            if let Some((s, reqs)) = self.docker.iter().find(|(s, _)| *s == scope) {
                return (format!("docker {s:?}"), reqs);
            }
        }
        match self.docker.iter().find(|(s, _)| s.is_empty()) {
            Some((_, reqs)) => ("docker \"\"".into(), reqs),
            None => ("default".into(), &self.default),
        }
    }

    /// What a pull of `r` must do.
    pub fn verdict(&self, r: &Reference) -> Verdict {
        let (scope, reqs) = self.for_image(r);
        let whose = || {
            format!(
                "{} (policy {}, scope {scope})",
                r.full(),
                self.source.display()
            )
        };
        for q in reqs {
            match q {
                Req::Reject => return Verdict::Refuse(format!("{}: rejected", whose())),
                Req::Unsupported(m) => return Verdict::Refuse(format!("{}: {m}", whose())),
                _ => {}
            }
        }
        if reqs.iter().all(|q| matches!(q, Req::Accept)) {
            return Verdict::Accept;
        }
        Verdict::Verify {
            reqs: reqs.to_vec(),
            scope,
            source: self.source.clone(),
        }
    }
}

/// The scopes that may name `r`, most specific first.
fn scopes(r: &Reference) -> Vec<String> {
    let repo = r.repository();
    let mut out = Vec::new();
    if let Some(d) = &r.digest {
        out.push(format!("{repo}@{d}"));
    } else if let Some(t) = &r.tag {
        out.push(format!("{repo}:{t}"));
    }
    let mut s = repo.as_str();
    loop {
        out.push(s.to_string());
        match s.rfind('/') {
            Some(i) => s = &s[..i],
            None => break,
        }
    }
    // `*.example.com` matches `a.example.com` and `b.a.example.com`, not `example.com`.
    let host = r.domain.split(':').next().unwrap_or_default();
    let mut rest = host;
    while let Some((_, tail)) = rest.split_once('.') {
        out.push(format!("*.{tail}"));
        rest = tail;
    }
    out
}

/// One signature found for the image: its payload and the signature bytes.
pub struct Found {
    payload: Vec<u8>,
    sig: Vec<u8>,
}

/// The cosign signatures stored for `digest` in `reg`'s repository (none: an empty list).
pub async fn fetch(reg: &Registry, digest: &str) -> Result<Vec<Found>, RegistryError> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| RegistryError::Invalid(format!("{digest}: not a sha256 digest")))?;
    let (body, _, sig_digest) = match reg
        .manifest(
            &format!("sha256-{hex}.sig"),
            super::store::MAX_DOCUMENT as usize,
        )
        .await
    {
        Ok(m) => m,
        Err(RegistryError::NotFound(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let m: Value = serde_json::from_slice(&body)
        .map_err(|e| RegistryError::Invalid(format!("signature manifest {sig_digest}: {e}")))?;
    let layers = m["layers"].as_array().cloned().unwrap_or_default();
    if layers.len() > MAX_SIGNATURES {
        return Err(RegistryError::Invalid(format!(
            "signature manifest {sig_digest}: {} signatures, more than {MAX_SIGNATURES}",
            layers.len()
        )));
    }
    let mut out = Vec::new();
    for l in layers {
        if l["mediaType"] != PAYLOAD_TYPE {
            continue;
        }
        let Some(sig) = l["annotations"][SIGNATURE_ANNOTATION].as_str() else {
            continue;
        };
        if sig.len() > MAX_SIGNATURE * 2 {
            continue;
        }
        let Ok(sig) = base64::engine::general_purpose::STANDARD.decode(sig) else {
            continue;
        };
        let Some(d) = l["digest"].as_str() else {
            continue;
        };
        super::store::digest_hex(d).map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let payload = reg.blob_bytes(d, MAX_PAYLOAD).await?;
        out.push(Found {
            payload: payload.to_vec(),
            sig,
        });
    }
    Ok(out)
}

/// Whether `found` meets every requirement for the image `r` resolved to `digest`; the error
/// names the scope and why.
pub fn check(
    reqs: &[Req],
    found: &[Found],
    r: &Reference,
    digest: &str,
    scope: &str,
    source: &Path,
) -> Result<(), String> {
    for q in reqs {
        let Req::Sigstore { keys, identity } = q else {
            continue;
        };
        let mut why = Vec::new();
        let ok = found
            .iter()
            .any(|f| match accepts(keys, identity, f, r, digest) {
                Ok(()) => true,
                Err(m) => {
                    why.push(m);
                    false
                }
            });
        if !ok {
            let detail = match why.is_empty() {
                true => "no sigstore signature is stored for it".to_string(),
                false => why.join("; "),
            };
            return Err(format!(
                "{} ({digest}) refused by signature policy {} scope {scope}: {detail}",
                r.full(),
                source.display()
            ));
        }
    }
    Ok(())
}

fn accepts(
    keys: &[Key],
    identity: &Identity,
    f: &Found,
    r: &Reference,
    digest: &str,
) -> Result<(), String> {
    if !keys.iter().any(|k| k.verifies(&f.payload, &f.sig)) {
        return Err("a signature verifies with none of the policy's keys".into());
    }
    let v: Value = serde_json::from_slice(&f.payload)
        .map_err(|e| format!("a signed payload is not JSON: {e}"))?;
    let c = &v["critical"];
    if c["type"] != "cosign container image signature" {
        return Err(format!("a signed payload of type {}", c["type"]));
    }
    let signed_digest = c["image"]["docker-manifest-digest"].as_str().unwrap_or("");
    if signed_digest != digest {
        return Err(format!(
            "a signature is for {signed_digest:?}, not {digest}"
        ));
    }
    let claimed = c["identity"]["docker-reference"].as_str().unwrap_or("");
    let claimed_ref = Reference::parse(claimed)
        .map_err(|_| format!("a signature claims the name {claimed:?}"))?;
    // A name without a tag or digest claims no tag (cosign's claim is the repository alone):
    // it is no exact match for any tagged reference, `:latest` included.
    let exact = |other: &str| explicit(claimed) && claimed_ref.full() == other;
    let matches = match identity {
        Identity::MatchExact => exact(&r.full()),
        Identity::MatchRepoDigestOrExact => match &r.digest {
            Some(_) => claimed_ref.repository() == r.repository(),
            None => exact(&r.full()),
        },
        Identity::MatchRepository => claimed_ref.repository() == r.repository(),
        Identity::ExactReference(want) => Reference::parse(want).is_ok_and(|w| exact(&w.full())),
        Identity::ExactRepository(want) => {
            Reference::parse(want).is_ok_and(|w| w.repository() == claimed_ref.repository())
        }
    };
    match matches {
        true => Ok(()),
        false => Err(format!(
            "a signature names {claimed:?}, which {identity:?} does not accept for {}",
            r.full()
        )),
    }
}

/// Whether a reference names a tag or digest (after its last `/`).
fn explicit(name: &str) -> bool {
    name.rsplit('/')
        .next()
        .is_some_and(|l| l.contains([':', '@']))
}

/// The fuzz entry: a policy file's text, then the verdict for a few references.
pub fn fuzz_policy(text: &str) {
    if let Ok(p) = parse(text, Path::new("fuzz.json")) {
        for image in [
            "busybox",
            "registry.example.com:5000/a/b/c:1",
            "x.io/y@sha256:0000000000000000000000000000000000000000000000000000000000000000",
        ] {
            if let Ok(r) = Reference::parse(image) {
                let _ = p.verdict(&r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> Reference {
        Reference::parse(s).unwrap()
    }

    #[test]
    fn the_most_specific_scope_decides() {
        let p = parse(
            r#"{"default": [{"type": "reject"}],
                "transports": {"docker": {
                    "reg.example:5000": [{"type": "reject"}],
                    "reg.example:5000/open": [{"type": "insecureAcceptAnything"}],
                    "reg.example:5000/open/closed:1": [{"type": "reject"}],
                    "*.example.com": [{"type": "insecureAcceptAnything"}],
                    "docker.io/library": [{"type": "insecureAcceptAnything"}]
                }, "atomic": {"whatever": [{"type": "reject"}]}}}"#,
            Path::new("p.json"),
        )
        .unwrap();
        let v = |s: &str| match p.verdict(&r(s)) {
            Verdict::Accept => "accept".to_string(),
            Verdict::Refuse(m) => m,
            Verdict::Verify { .. } => "verify".into(),
        };
        assert_eq!(v("reg.example:5000/open/x:1"), "accept");
        assert_eq!(v("reg.example:5000/open/closed:2"), "accept");
        assert!(v("reg.example:5000/open/closed:1")
            .contains("scope docker \"reg.example:5000/open/closed:1\""));
        assert!(v("reg.example:5000/other:1").contains("scope docker \"reg.example:5000\""));
        assert_eq!(v("a.b.example.com/x"), "accept");
        assert!(
            v("example.com/x").contains("scope default"),
            "the wildcard is for subdomains"
        );
        assert_eq!(v("busybox"), "accept");
        assert!(v("quay.io/x").contains("rejected"));
    }

    #[test]
    fn what_cannot_be_checked_refuses_and_bad_files_are_errors() {
        for (text, says) in [
            (
                r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k"}]}"#,
                "signedBy",
            ),
            (
                r#"{"default": [{"type": "sigstoreSigned", "fulcio": {}}]}"#,
                "fulcio",
            ),
        ] {
            let p = parse(text, Path::new("p.json")).unwrap();
            match p.verdict(&r("busybox")) {
                Verdict::Refuse(m) => assert!(m.contains(says), "{m}"),
                v => panic!("{text}: {v:?}"),
            }
        }
        for (text, says) in [
            (r#"{"default": []}"#, "no requirement"),
            (
                r#"{"default": [{"type": "insecureAcceptAnything"}], "extra": 1}"#,
                "unknown field",
            ),
            (
                r#"{"default": [{"type": "accept"}]}"#,
                "unknown requirement type",
            ),
            (
                r#"{"default": [{"type": "reject", "keyPath": "/x"}]}"#,
                "takes no other field",
            ),
            (
                r#"{"default": [{"type": "sigstoreSigned"}]}"#,
                "names no key",
            ),
            (
                r#"{"default": [{"type": "sigstoreSigned", "keyData": "!!"}]}"#,
                "base64",
            ),
            (
                r#"{"default": [{"type": "sigstoreSigned", "keyData": "aGVsbG8="}]}"#,
                "PEM",
            ),
            (
                r#"{"default": [{"type": "reject"}], "transports": {"docker": {"a/*": [{"type": "reject"}]}}}"#,
                "expected HOST",
            ),
            (
                r#"{"default": [{"type": "reject"}], "transports": {"docker": {"x": []}}}"#,
                "no requirement",
            ),
        ] {
            let e = parse(text, Path::new("p.json")).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
