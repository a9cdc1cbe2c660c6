//! Image references normalized as kubelet and crictl do: `busybox` →
//! `docker.io/library/busybox:latest`; `name@sha256:…` digests kept.

use crate::error::Error;

/// A normalized reference: `domain/path[:tag][@digest]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub domain: String,
    pub path: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Reference {
    pub fn parse(input: &str) -> Result<Reference, Error> {
        let bad = |why: &str| Error::InvalidArgument(format!("image reference {input:?}: {why}"));
        if input.is_empty()
            || input.len() > 512
            || input.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(bad("empty, too long, or contains whitespace"));
        }
        let (name, digest) = match input.split_once('@') {
            Some((n, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| bad("only sha256 digests are supported"))?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad("malformed digest"));
                }
                (n, Some(d.to_ascii_lowercase()))
            }
            None => (input, None),
        };
        let (mut domain, rest) = match name.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), rest.to_string())
            }
            _ => ("docker.io".to_string(), name.to_string()),
        };
        let (host, port) = match domain.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (domain.as_str(), None),
        };
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-".contains(&b))
            || port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad("invalid registry host"));
        }
        if domain == "index.docker.io" {
            domain = "docker.io".into();
        }
        // A tag is a ':' after the last '/'.
        let (path, tag) = match rest.rsplit_once(':') {
            Some((p, t)) if !t.contains('/') => (p.to_string(), Some(t.to_string())),
            _ => (rest, None),
        };
        let path = if domain == "docker.io" && !path.contains('/') {
            format!("library/{path}")
        } else {
            path
        };
        if path.is_empty()
            || path
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
            || !path
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
        {
            return Err(bad("invalid repository name"));
        }
        // Docker's limit on the whole name; it also keeps the normalized form (which adds the
        // default domain and `library/`) parseable again.
        if domain.len() + 1 + path.len() > 255 {
            return Err(bad("the name is longer than 255 characters"));
        }
        if let Some(t) = &tag {
            if t.is_empty()
                || t.len() > 128
                || !t
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            {
                return Err(bad("invalid tag"));
            }
        }
        let tag = if tag.is_none() && digest.is_none() {
            Some("latest".to_string())
        } else {
            tag
        };
        Ok(Reference {
            domain,
            path,
            tag,
            digest,
        })
    }

    /// `domain/path`.
    pub fn repository(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// The full normalized form.
    pub fn full(&self) -> String {
        let mut s = self.repository();
        if let Some(t) = &self.tag {
            s += ":";
            s += t;
        }
        if let Some(d) = &self.digest {
            s += "@";
            s += d;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_like_kubelet() {
        let n = |s: &str| Reference::parse(s).unwrap().full();
        assert_eq!(n("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(n("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(n("foo/bar"), "docker.io/foo/bar:latest");
        assert_eq!(n("localhost:5000/x/y:v1"), "localhost:5000/x/y:v1");
        assert_eq!(n("registry.k8s.io/pause:3.9"), "registry.k8s.io/pause:3.9");
        let d = format!("busybox@sha256:{}", "a".repeat(64));
        assert_eq!(
            n(&d),
            format!("docker.io/library/busybox@sha256:{}", "a".repeat(64))
        );
        for bad in ["", "a b", "UPPER", "x/../y", "busybox@md5:00", "a:b:c/d"] {
            assert!(Reference::parse(bad).is_err(), "{bad:?}");
        }
        // Found by the fuzzer: a long name whose normalized form no longer parsed.
        let long = format!("ri/{}", "a/".repeat(250));
        assert!(Reference::parse(long.trim_end_matches('/')).is_err());
        let ok = format!("x/{}", "b".repeat(240));
        let r = Reference::parse(&ok).unwrap();
        assert_eq!(Reference::parse(&r.full()).unwrap(), r);
    }
}
