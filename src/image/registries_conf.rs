//! containers-registries.conf v2, as CRI-O and podman read it: the file, then its drop-in
//! dir's `*.conf` in name order (a `[[registry]]` whose prefix was seen before replaces the
//! earlier one). For a reference, the `[[registry]]` with the longest matching `prefix`
//! (`host`, `host/repo…`, or `*.domain` for its subdomains; default: its `location`)
//! decides: `blocked` refuses the pull, its `[[registry.mirror]]`s are tried first (per
//! `pull-from-mirror`: `all`, `digest-only`, `tag-only`; `mirror-by-digest-only` of the
//! registry), then its `location` — the prefix replaced by it, so a repository can move.
//! `insecure` allows plain HTTP and an unverified certificate. The short-name settings
//! (`unqualified-search-registries`, `[aliases]`, `short-name-mode`) are read here too and
//! served by `short_names.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::endpoints::{is_loopback, read_config_file, Endpoint};
use super::reference::Reference;
use crate::error::Error;

/// Largest file read, most drop-ins, most `[[registry]]` tables in all of them.
const MAX_FILE: u64 = 1 << 20;
const MAX_DROP_INS: usize = 256;
const MAX_REGISTRIES: usize = 4096;
/// Most `unqualified-search-registries`, most `[aliases]` in all files together.
const MAX_SEARCH: usize = 64;
const MAX_ALIASES: usize = 4096;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct File {
    #[serde(default)]
    registry: Vec<Registry>,
    unqualified_search_registries: Option<Vec<String>>,
    short_name_mode: Option<String>,
    aliases: Option<BTreeMap<String, String>>,
    /// The v1 format's tables (`[registries.search]`, `.insecure`, `.block`).
    registries: Option<toml::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Registry {
    prefix: Option<String>,
    location: Option<String>,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    blocked: bool,
    #[serde(default)]
    mirror_by_digest_only: bool,
    #[serde(default)]
    mirror: Vec<Mirror>,
    /// Which file said it (for errors).
    #[serde(skip)]
    source: PathBuf,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Mirror {
    location: String,
    #[serde(default)]
    insecure: bool,
    pull_from_mirror: Option<String>,
}

impl Registry {
    fn prefix(&self) -> &str {
        self.prefix
            .as_deref()
            .or(self.location.as_deref())
            .unwrap_or("")
    }
}

/// The short-name settings of all files: the last file that sets
/// `unqualified-search-registries` decides them (with the file's name, for messages); an
/// alias of a later file replaces an earlier one's, an empty one removes it.
#[derive(Debug, Default)]
pub(super) struct ShortNameConf {
    pub search: Option<(Vec<String>, PathBuf)>,
    /// short name → (fully qualified repository, the file that said it)
    pub aliases: BTreeMap<String, (String, PathBuf)>,
}

/// What the files say.
#[derive(Debug, Default)]
struct Loaded {
    registries: Vec<Registry>,
    short: ShortNameConf,
}

/// The short-name settings of `file` and `drop_ins` (`short_names.rs`).
pub(super) fn short_names(
    file: Option<&Path>,
    drop_ins: Option<&Path>,
) -> Result<ShortNameConf, Error> {
    Ok(load(file, drop_ins)?.short)
}

/// `host[:port]`, as a search registry is written.
fn is_host(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
}

/// Every `[[registry]]` of `file` and of `drop_ins`' `*.conf`, later prefixes replacing
/// earlier ones, and the short-name settings. Files that do not exist are skipped.
fn load(file: Option<&Path>, drop_ins: Option<&Path>) -> Result<Loaded, Error> {
    let mut files: Vec<PathBuf> = file.map(Path::to_path_buf).into_iter().collect();
    if let Some(d) = drop_ins {
        match std::fs::read_dir(d) {
            Ok(rd) => {
                // The listing stops at the cap: a dir of a million files is not read whole.
                let mut names: Vec<PathBuf> = rd
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                    .take(MAX_DROP_INS + 1)
                    .collect();
                if names.len() > MAX_DROP_INS {
                    return Err(Error::Config(format!(
                        "{}: more than the {MAX_DROP_INS} drop-ins read",
                        d.display(),
                    )));
                }
                names.sort();
                files.extend(names);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Config(format!("{}: {e}", d.display()))),
        }
    }
    let mut out: Vec<Registry> = Vec::new();
    let mut short = ShortNameConf::default();
    for f in files {
        let Some(text) = read_config_file(&f, MAX_FILE)? else {
            continue;
        };
        let bad = |why: String| Error::Config(format!("{}: {why}", f.display()));
        let parsed: File = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if parsed.registries.is_some() {
            return Err(bad(
                "the version 1 format ([registries.search], .insecure, .block) is not read; write [[registry]] tables".into(),
            ));
        }
        if let Some(mode) = &parsed.short_name_mode {
            // Read and checked; a daemon cannot prompt, so every mode resolves as CRI-O's
            // (which sets `disabled`): the alias, else each search registry in turn.
            if !["enforcing", "permissive", "disabled"].contains(&mode.as_str()) {
                return Err(bad(format!(
                    "short-name-mode {mode:?} is none of enforcing, permissive, disabled"
                )));
            }
        }
        if let Some(search) = parsed.unqualified_search_registries {
            if search.len() > MAX_SEARCH {
                return Err(bad(format!(
                    "more than {MAX_SEARCH} unqualified-search-registries"
                )));
            }
            if let Some(h) = search.iter().find(|h| !is_host(h)) {
                return Err(bad(format!(
                    "unqualified-search-registries: {h:?} is not host[:port]"
                )));
            }
            short.search = Some((search, f.clone()));
        }
        for (name, target) in parsed.aliases.unwrap_or_default() {
            if let Err(why) = super::short_names::check_alias(&name, &target) {
                return Err(bad(format!("[aliases] {name:?} = {target:?}: {why}")));
            }
            if target.is_empty() {
                short.aliases.remove(&name);
            } else {
                short.aliases.insert(name, (target, f.clone()));
            }
            if short.aliases.len() > MAX_ALIASES {
                return Err(bad(format!("more than {MAX_ALIASES} [aliases]")));
            }
        }
        for mut r in parsed.registry {
            r.source = f.clone();
            if r.prefix().is_empty() {
                return Err(bad("a [[registry]] with neither prefix nor location".into()));
            }
            if r.prefix().starts_with("*.") && r.location.is_some() && r.prefix != r.location {
                return Err(bad(format!(
                    "[[registry]] {:?}: a wildcard prefix takes no location",
                    r.prefix()
                )));
            }
            out.retain(|o| o.prefix() != r.prefix());
            out.push(r);
            if out.len() > MAX_REGISTRIES {
                return Err(bad(format!(
                    "more than {MAX_REGISTRIES} [[registry]] tables"
                )));
            }
        }
    }
    Ok(Loaded {
        registries: out,
        short,
    })
}

/// How many bytes of `name` (`domain/path`) `prefix` matches, if it does: at a boundary
/// (`/`, `:`, `@` or the end), or for `*.domain`, a subdomain of it (the whole host).
fn matches(prefix: &str, name: &str, domain: &str) -> Option<usize> {
    if let Some(suffix) = prefix.strip_prefix('*') {
        let host = domain.split(':').next().unwrap_or(domain);
        return (suffix.starts_with('.') && host.len() > suffix.len() && host.ends_with(suffix))
            .then_some(domain.len());
    }
    let rest = name.strip_prefix(prefix)?;
    (rest.is_empty() || rest.starts_with(['/', ':', '@'])).then_some(prefix.len())
}

/// What registries.conf says for `r`: None when no `[[registry]]` matches; a refusal when
/// the matching one is blocked; else its endpoints, mirrors first.
pub(super) fn endpoints(
    file: Option<&Path>,
    drop_ins: Option<&Path>,
    r: &Reference,
) -> Result<Option<Vec<Endpoint>>, Error> {
    let regs = load(file, drop_ins)?.registries;
    let name = format!("{}/{}", r.domain, r.path);
    let Some((reg, len)) = regs
        .iter()
        .filter_map(|g| matches(g.prefix(), &name, &r.domain).map(|n| (g, n)))
        .max_by_key(|(_, n)| *n)
    else {
        return Ok(None);
    };
    if reg.blocked {
        return Err(Error::PermissionDenied(format!(
            "pull of {}: registry prefix {:?} is blocked by {}",
            r.full(),
            reg.prefix(),
            reg.source.display()
        )));
    }
    let wildcard = reg.prefix().starts_with('*');
    let rest = &name[len.min(name.len())..];
    let mut out = Vec::new();
    for m in &reg.mirror {
        let mode = m
            .pull_from_mirror
            .as_deref()
            .unwrap_or(if reg.mirror_by_digest_only {
                "digest-only"
            } else {
                "all"
            });
        let use_it = match mode {
            "all" => true,
            "digest-only" => r.digest.is_some(),
            "tag-only" => r.digest.is_none(),
            other => {
                return Err(Error::Config(format!(
                    "{}: [[registry.mirror]] {:?}: pull-from-mirror {other:?} is none of all, digest-only, tag-only",
                    reg.source.display(),
                    m.location
                )))
            }
        };
        if use_it {
            let loc = if wildcard {
                name.clone()
            } else {
                format!("{}{rest}", m.location)
            };
            push(&mut out, &loc, m.insecure, &reg.source)?;
        }
    }
    let loc = match (&reg.location, wildcard) {
        (Some(l), false) => format!("{l}{rest}"),
        _ => name.clone(),
    };
    push(&mut out, &loc, reg.insecure, &reg.source)?;
    Ok(Some(out))
}

/// The endpoints of `location` (`host[:port]/repo…`): HTTPS, and with `insecure` (or on
/// loopback) plain HTTP after it.
fn push(
    out: &mut Vec<Endpoint>,
    location: &str,
    insecure: bool,
    source: &Path,
) -> Result<(), Error> {
    let (host, repo) = location.split_once('/').ok_or_else(|| {
        Error::Config(format!(
            "{}: location {location:?} names no repository",
            source.display()
        ))
    })?;
    if host.is_empty() || repo.is_empty() || location.contains("://") {
        return Err(Error::Config(format!(
            "{}: location {location:?} is not host[:port]/path",
            source.display()
        )));
    }
    let ep = Endpoint {
        host: super::registry::api_host(host).to_string(),
        plain_http: false,
        root: "/v2".into(),
        repo: repo.to_string(),
        ca: Vec::new(),
        skip_verify: insecure,
    };
    if insecure || is_loopback(host) {
        out.push(ep.clone());
        out.push(Endpoint {
            plain_http: true,
            ..ep
        });
    } else {
        out.push(ep);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(eps: &[Endpoint]) -> Vec<String> {
        eps.iter()
            .map(|e| format!("{}/{}", e.url(), e.repo))
            .collect()
    }

    #[test]
    fn longest_prefix_mirrors_location_and_drop_ins() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("registries.conf");
        std::fs::write(
            &f,
            r#"
unqualified-search-registries = ["docker.io"]
[[registry]]
prefix = "example.com"
location = "example.com"
[[registry.mirror]]
location = "mirror.example/cache"
[[registry.mirror]]
location = "digests.example/cache"
pull-from-mirror = "digest-only"

[[registry]]
prefix = "example.com/team"
location = "internal.example:5000/moved"
insecure = true

[[registry]]
prefix = "*.blocked.example"
blocked = true

[[registry]]
location = "gone.example"
blocked = true
"#,
        )
        .unwrap();
        let d = t.path().join("registries.conf.d");
        std::fs::create_dir(&d).unwrap();
        // Replaces the file's gone.example.
        std::fs::write(
            d.join("10-gone.conf"),
            "[[registry]]\nlocation = \"gone.example\"\n",
        )
        .unwrap();
        std::fs::write(d.join("ignored.txt"), "not toml [").unwrap();
        let ep = |s: &str| endpoints(Some(&f), Some(&d), &Reference::parse(s).unwrap());

        assert_eq!(
            urls(&ep("example.com/app:1").unwrap().unwrap()),
            vec![
                "https://mirror.example/v2/cache/app",
                "https://example.com/v2/app"
            ]
        );
        let digest = format!("example.com/app@sha256:{}", "b".repeat(64));
        assert_eq!(ep(&digest).unwrap().unwrap().len(), 3);
        // The longer prefix wins, and moves the repository; insecure adds plain HTTP.
        let eps = ep("example.com/team/app:1").unwrap().unwrap();
        assert_eq!(
            urls(&eps),
            vec![
                "https://internal.example:5000/v2/moved/app",
                "http://internal.example:5000/v2/moved/app"
            ]
        );
        assert!(eps[0].skip_verify);
        // Not at a boundary: no match.
        assert!(ep("example.com.evil/app").unwrap().is_none());
        assert!(ep("example.community/app").unwrap().is_none());
        let e = ep("a.blocked.example/x").unwrap_err();
        assert!(
            matches!(e, Error::PermissionDenied(_)) && e.to_string().contains("*.blocked.example"),
            "{e}"
        );
        assert!(ep("blocked.example/x").unwrap().is_none());
        assert_eq!(
            urls(&ep("gone.example/x").unwrap().unwrap()),
            vec!["https://gone.example/v2/x"]
        );
        assert!(ep("busybox").unwrap().is_none());
        // Absent files are no configuration.
        let none = t.path().join("absent");
        assert!(endpoints(
            Some(&none),
            Some(&none),
            &Reference::parse("example.com/x").unwrap()
        )
        .unwrap()
        .is_none());
    }

    #[test]
    fn refusals_name_the_file() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("r.conf");
        let r = Reference::parse("example.com/x").unwrap();
        for (text, says) in [
            ("[registries.search]\nregistries = [\"docker.io\"]\n", "version 1"),
            ("[[registry]]\ninsecure = true\n", "neither prefix nor location"),
            ("[[registry]]\nprefix = \"example.com/x\"\nlocation = \"nohost\"\n", "names no repository"),
            ("[[registry]]\nlocation = \"example.com\"\n[[registry.mirror]]\nlocation = \"m.example\"\npull-from-mirror = \"some\"\n", "pull-from-mirror"),
            ("[[registry]\n", "r.conf"),
        ] {
            std::fs::write(&f, text).unwrap();
            let e = endpoints(Some(&f), None, &r).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("r.conf"), "{text}: {e}");
        }
    }
}
