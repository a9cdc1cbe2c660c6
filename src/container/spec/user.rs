//! The user of a container's process, resolved from the CRI security context and the
//! image's `USER`, looked up in the image's `/etc/passwd` and `/etc/group`.

use std::path::Path;

use super::super::ContainerConfig;
use super::validate::invalid;
use crate::error::Result;
use crate::image::ExecConfig;

/// The resolved user of the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub additional_gids: Vec<u32>,
}

/// Largest `/etc/passwd` or `/etc/group` read from an image.
const MAX_DB: u64 = 4 << 20;

/// One of the image's account databases, read as a stream of `:`-separated records.
struct Db<'a> {
    rootfs: &'a Path,
    rel: &'static str,
    /// Why the file was not read, if it was refused (a symlink, a FIFO, too large…); the
    /// file then counts as empty and lookups that needed it say why.
    refused: std::cell::RefCell<Option<String>>,
}

impl<'a> Db<'a> {
    fn new(rootfs: &'a Path, rel: &'static str) -> Self {
        Db {
            rootfs,
            rel,
            refused: Default::default(),
        }
    }

    /// Calls `f` with the fields of each record until it returns `Some`. The file is opened
    /// without following symlinks and without blocking, must be a regular file of at most
    /// [`MAX_DB`] bytes, and is read line by line.
    fn find<T>(&self, mut f: impl FnMut(&[&str]) -> Option<T>) -> Option<T> {
        use std::io::BufRead;
        let file = match crate::untrusted_fs::open_beneath(self.rootfs, Path::new(self.rel), MAX_DB)
        {
            Ok(Some(file)) => file,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "ignoring the image's {}", self.rel);
                *self.refused.borrow_mut() = Some(e.to_string());
                return None;
            }
        };
        let mut r = std::io::BufReader::new(std::io::Read::take(file, MAX_DB));
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let fields: Vec<&str> = text.trim_end_matches(['\n', '\r']).split(':').collect();
            if let Some(v) = f(&fields) {
                return Some(v);
            }
        }
    }

    /// Every value `f` picks, in file order.
    fn all<T>(&self, mut f: impl FnMut(&[&str]) -> Option<T>) -> Vec<T> {
        let mut out = Vec::new();
        self.find(|fields| -> Option<()> {
            out.extend(f(fields));
            None
        });
        out
    }

    /// " (it was not read: …)" when the file was refused.
    fn why(&self) -> String {
        self.refused
            .borrow()
            .as_ref()
            .map(|r| format!(" (it was not read: {r})"))
            .unwrap_or_default()
    }
}

/// `(name, uid, gid)` of a passwd record.
fn passwd_entry(f: &[&str]) -> Option<(String, u32, u32)> {
    Some((
        f.first()?.to_string(),
        f.get(2)?.parse().ok()?,
        f.get(3)?.parse().ok()?,
    ))
}

/// `(name, gid)` of a group record, and whether `user` is among its members.
fn group_entry(f: &[&str], user: Option<&str>) -> Option<(String, u32, bool)> {
    let member = user.is_some_and(|u| f.get(3).is_some_and(|m| m.split(',').any(|x| x == u)));
    Some((f.first()?.to_string(), f.get(2)?.parse().ok()?, member))
}

/// Resolves the user: `run_as_username` in the image's /etc/passwd, or `run_as_user`, or the
/// image's `USER` (`name|uid[:group|gid]`); the group from `run_as_group`, the passwd entry
/// or 0; supplementary groups from /etc/group plus `supplemental_groups`.
pub fn resolve_user(c: &ContainerConfig, image: &ExecConfig, rootfs: &Path) -> Result<User> {
    let s = &c.security;
    let passwd = Db::new(rootfs, "etc/passwd");
    let groups = Db::new(rootfs, "etc/group");
    let by_name = |n: &str, field: &str| {
        passwd
            .find(|f| passwd_entry(f).filter(|(name, _, _)| name == n))
            .map(|(_, uid, gid)| (uid, Some(gid)))
            .ok_or_else(|| {
                invalid(format!(
                    "{field}: user {n:?} is not in the image's /etc/passwd{}",
                    passwd.why()
                ))
            })
    };
    let gid_of = |u: u32| passwd.find(|f| passwd_entry(f).filter(|e| e.1 == u).map(|e| e.2));
    let (uid, mut gid, group_spec) = if !s.run_as_username.is_empty() {
        let (u, g) = by_name(&s.run_as_username, "security_context.run_as_username")?;
        (u, g, None)
    } else if let Some(u) = s.run_as_user {
        let u = u as u32;
        (u, gid_of(u), None)
    } else {
        let (user, group) = match image.user.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (image.user.as_str(), None),
        };
        let (u, g) = if user.is_empty() {
            (0, Some(0))
        } else if let Ok(u) = user.parse::<u32>() {
            (u, gid_of(u))
        } else {
            by_name(user, "image config User")?
        };
        (u, g, group.filter(|g| !g.is_empty()))
    };
    if let Some(g) = group_spec {
        gid = Some(match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => groups
                .find(|f| group_entry(f, None).filter(|e| e.0 == g).map(|e| e.1))
                .ok_or_else(|| {
                    invalid(format!(
                        "image config User: group {g:?} is not in /etc/group{}",
                        groups.why()
                    ))
                })?,
        });
    }
    if let Some(g) = s.run_as_group {
        gid = Some(g as u32);
    }
    let name = match s.supplemental_groups_policy {
        super::super::GroupsPolicy::Merge => {
            passwd.find(|f| passwd_entry(f).filter(|e| e.1 == uid).map(|e| e.0))
        }
        // Strict: the image's /etc/group adds nothing.
        super::super::GroupsPolicy::Strict => None,
    };
    let mut additional: Vec<u32> = match &name {
        Some(n) => groups.all(|f| group_entry(f, Some(n)).filter(|e| e.2).map(|e| e.1)),
        None => Vec::new(),
    };
    additional.extend(s.supplemental_groups.iter().map(|g| *g as u32));
    additional.sort_unstable();
    additional.dedup();
    // The process's group list holds its primary gid too (as `id -G` shows it and kubelet
    // expects in `ContainerStatus.user`): first, then the others.
    let gid = gid.unwrap_or(0);
    additional.retain(|g| *g != gid);
    additional.insert(0, gid);
    if additional.len() > 65536 {
        return Err(invalid(format!(
            "the user is in {} groups; the kernel allows 65536",
            additional.len()
        )));
    }
    Ok(User {
        uid,
        gid,
        additional_gids: additional,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_from_passwd() {
        let d = std::env::temp_dir().join(format!("sandboxd-spec-{}", std::process::id()));
        std::fs::create_dir_all(d.join("etc")).unwrap();
        std::fs::write(
            d.join("etc/passwd"),
            "root:x:0:0::/:/bin/sh\napp:x:1234:1235::/:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(d.join("etc/group"), "app:x:1235:\nextra:x:77:app\n").unwrap();
        let mut c = ContainerConfig::default();
        c.security.run_as_username = "app".into();
        let u = resolve_user(&c, &ExecConfig::default(), &d).unwrap();
        assert_eq!(
            (u.uid, u.gid, u.additional_gids.clone()),
            (1234, 1235, vec![1235, 77])
        );
        c.security.run_as_username.clear();
        c.security.run_as_user = Some(5);
        c.security.supplemental_groups = vec![9];
        let u = resolve_user(&c, &ExecConfig::default(), &d).unwrap();
        assert_eq!((u.uid, u.gid, u.additional_gids), (5, 0, vec![0, 9]));
        let img = ExecConfig {
            user: "app:extra".into(),
            ..Default::default()
        };
        let u = resolve_user(&ContainerConfig::default(), &img, &d).unwrap();
        assert_eq!((u.uid, u.gid), (1234, 77));
        c.security.run_as_user = None;
        c.security.run_as_username = "nobody".into();
        assert!(resolve_user(&c, &ExecConfig::default(), &d).is_err());
        // A hostile /etc/passwd (a FIFO, a symlink to a host file) is not read, and the
        // error says why; it never blocks.
        std::fs::remove_file(d.join("etc/passwd")).unwrap();
        nix::unistd::mkfifo(
            &d.join("etc/passwd"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        c.security.run_as_username = "app".into();
        let t = std::time::Instant::now();
        let e = resolve_user(&c, &ExecConfig::default(), &d).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        std::fs::remove_file(d.join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.join("etc/passwd")).unwrap();
        c.security.run_as_username = "root".into();
        let e = resolve_user(&c, &ExecConfig::default(), &d).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
