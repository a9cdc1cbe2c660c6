//! The systemd cgroup driver: unit names, their cgroup paths, and the few D-Bus calls the
//! daemon makes itself.
//!
//! Who does what (the design containerd and CRI-O chose too): every container's and infra's
//! cgroup is a transient scope `sandboxd-<id>.scope` that the OCI runtime makes through its
//! own systemd driver (`--systemd-cgroup`, cgroupsPath `<slice>:sandboxd:<id>`), with the
//! container's resources as unit properties — runc, crun and runsc know the pid and the
//! resources at the moment the scope must exist, and stop it at `delete`. The daemon talks to
//! systemd (over the system bus, with `zbus`) only where no runtime call covers it: the slice
//! it makes for a pod that names no parent (`<stem>-pod<id>.slice`, sized by the pod-level
//! resources through unit properties) and stopping units at teardown. kubelet's own slices
//! (`kubepods-burstable-pod<uid>.slice`) are kubelet's: used as parents, never stopped here.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::PodLimits;
use crate::error::HostError;

/// The prefix of our scopes: `<slice>:sandboxd:<id>` makes `sandboxd-<id>.scope`.
pub const SCOPE_PREFIX: &str = "sandboxd";

/// How long a unit may take to appear or go away after its job was queued.
const UNIT_WAIT: Duration = Duration::from_secs(10);

/// How long one D-Bus call may wait for systemd's answer (a hung systemd costs the CRI call
/// at most this per try, never a thread for ever).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Is systemd the init system here (`sd_booted()`: `/run/systemd/system` exists)?
pub fn booted() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Is `name` a slice unit name (`a-b.slice`, no path)?
pub fn is_slice(name: &str) -> bool {
    name.ends_with(".slice") && !name.contains('/') && !name.contains(':')
}

/// `a-b-c.slice` → `/a.slice/a-b.slice/a-b-c.slice`, systemd's own expansion of a slice name
/// into its cgroup path (`-.slice` is the root). `None` for a name that is not a valid slice.
pub fn expand_slice(slice: &str) -> Option<String> {
    let stem = slice.strip_suffix(".slice")?;
    if stem == "-" {
        return Some("/".into());
    }
    if stem.is_empty()
        || stem.starts_with('-')
        || stem.ends_with('-')
        || stem.contains("--")
        || !stem
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:\\@".contains(&b))
    {
        return None;
    }
    let mut path = String::new();
    for (i, _) in stem.match_indices('-').chain([(stem.len(), "")]) {
        path.push('/');
        path.push_str(&stem[..i]);
        path.push_str(".slice");
    }
    Some(path)
}

/// The unit of a cgroup in the systemd driver's form: `slice:prefix:name` is the scope
/// `prefix-name.scope`, `x.slice` the slice itself; `None` for a cgroupfs path.
pub fn unit_of(cgroup: &str) -> Option<String> {
    if is_slice(cgroup) {
        return Some(cgroup.to_string());
    }
    let mut parts = cgroup.splitn(3, ':');
    let (slice, prefix, name) = (parts.next()?, parts.next()?, parts.next()?);
    (is_slice(slice) && !prefix.is_empty() && !name.is_empty() && !name.contains('/'))
        .then(|| format!("{prefix}-{name}.scope"))
}

/// The cgroupfs path of `cgroup`, given in either driver's form (see [`unit_of`]); a path is
/// itself. A malformed systemd name maps to a path no hierarchy holds.
pub fn fs_path(cgroup: &str) -> Cow<'_, str> {
    if is_slice(cgroup) {
        return Cow::Owned(expand_slice(cgroup).unwrap_or_else(|| "/.invalid-slice".into()));
    }
    match (cgroup.split_once(':'), unit_of(cgroup)) {
        (Some((slice, _)), Some(scope)) => Cow::Owned(format!(
            "{}/{scope}",
            expand_slice(slice)
                .unwrap_or_else(|| "/.invalid-slice".into())
                .trim_end_matches('/')
        )),
        (Some(_), None) => Cow::Borrowed("/.invalid-scope"),
        _ => Cow::Borrowed(cgroup),
    }
}

/// The systemd properties that size a slice like `l` (unlimited where `l` sets nothing).
fn slice_properties(l: &PodLimits) -> Vec<(&'static str, zbus::zvariant::Value<'static>)> {
    use zbus::zvariant::Value;
    let mut p = vec![
        (
            "MemoryMax",
            Value::U64(if l.memory > 0 {
                l.memory as u64
            } else {
                u64::MAX
            }),
        ),
        (
            "CPUQuotaPerSecUSec",
            Value::U64(if l.cpu_quota > 0 && l.cpu_period > 0 {
                (l.cpu_quota as u64).saturating_mul(1_000_000) / l.cpu_period as u64
            } else {
                u64::MAX
            }),
        ),
        // systemd takes 1 ms..1 s; unset is the kernel's default period.
        (
            "CPUQuotaPeriodUSec",
            Value::U64(if l.cpu_period > 0 {
                l.cpu_period as u64
            } else {
                100_000
            }),
        ),
    ];
    if l.cpu_shares > 0 {
        // runc's and kubelet's conversion of shares (2..262144) to weight (1..10000).
        let shares = l.cpu_shares.clamp(2, 262_144) as u64;
        p.push(("CPUWeight", Value::U64(1 + ((shares - 2) * 9999) / 262_142)));
    }
    p
}

/// A connection to the system bus, made at first need and made again after a failure (the
/// bus or systemd restarted).
static BUS: Mutex<Option<zbus::blocking::Connection>> = Mutex::new(None);

fn bus() -> Result<zbus::blocking::Connection, HostError> {
    let mut b = BUS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = b.as_ref() {
        return Ok(c.clone());
    }
    let c = zbus::blocking::connection::Builder::system()
        .map(|b| b.method_timeout(CALL_TIMEOUT))
        .and_then(|b| b.build())
        .map_err(|e| HostError::Other(format!("systemd: connecting to the system bus: {e}")))?;
    *b = Some(c.clone());
    Ok(c)
}

/// The D-Bus error name of a failed call, if systemd answered with one.
fn error_name(e: &zbus::Error) -> Option<String> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.to_string()),
        _ => None,
    }
}

/// Calls a method of systemd's Manager; a transport failure or a systemd that is not on the
/// bus (re-executing) is tried again on a new connection until [`UNIT_WAIT`].
fn call<B>(method: &str, body: &B) -> Result<(), zbus::Error>
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
{
    let deadline = Instant::now() + UNIT_WAIT;
    loop {
        let r = bus()
            .map_err(|e| zbus::Error::Failure(e.to_string()))
            .and_then(|c| {
                c.call_method(
                    Some("org.freedesktop.systemd1"),
                    "/org/freedesktop/systemd1",
                    Some("org.freedesktop.systemd1.Manager"),
                    method,
                    body,
                )
                .map(drop)
            });
        let retry = match &r {
            Ok(()) => false,
            Err(e) => match error_name(e).as_deref() {
                Some(
                    "org.freedesktop.DBus.Error.ServiceUnknown"
                    | "org.freedesktop.DBus.Error.NameHasNoOwner"
                    | "org.freedesktop.DBus.Error.NoReply"
                    | "org.freedesktop.DBus.Error.Disconnected",
                ) => true,
                Some(_) => false,
                None => {
                    // Transport: the next try connects again.
                    *BUS.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    true
                }
            },
        };
        if !retry || Instant::now() >= deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn failed(op: &str, unit: &str, e: zbus::Error) -> HostError {
    HostError::Other(format!("systemd: {op} {unit}: {e}"))
}

/// Does the cgroup at cgroupfs path `path` exist in any hierarchy?
fn cgroup_exists(path: &str) -> bool {
    super::hierarchies()
        .iter()
        .any(|h| super::join(&h.mount_point, path).is_dir())
}

/// Waits until the cgroup of `unit` (at cgroupfs path `path`) exists (`present`) or is gone.
fn wait_cgroup(unit: &str, path: &str, present: bool) -> Result<(), HostError> {
    let deadline = Instant::now() + UNIT_WAIT;
    loop {
        let exists = cgroup_exists(path);
        if exists == present {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(HostError::Other(format!(
                "systemd: {unit}: its cgroup {path} is still {} after {}s",
                if present { "missing" } else { "present" },
                UNIT_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Makes the slice `name` (a transient unit) sized by `l`, or resizes it when it exists.
pub fn set_slice(name: &str, l: &PodLimits) -> Result<(), HostError> {
    let Some(path) = expand_slice(name) else {
        return Err(HostError::Refused {
            op: "set slice properties",
            path: name.into(),
            reason: "not a slice name".into(),
        });
    };
    let props = slice_properties(l);
    let mut start = props.clone();
    start.push((
        "Description",
        zbus::zvariant::Value::from("sandboxd pod slice"),
    ));
    let aux: Vec<(&str, Vec<(&str, zbus::zvariant::Value)>)> = Vec::new();
    match call("StartTransientUnit", &(name, "fail", start, aux)) {
        Ok(()) => wait_cgroup(name, &path, true),
        // Known already (made implicitly as the parent of a scope, or by an earlier call):
        // resized, and started should it be inactive.
        Err(e) if error_name(&e).as_deref() == Some("org.freedesktop.systemd1.UnitExists") => {
            call("SetUnitProperties", &(name, true, props))
                .map_err(|e| failed("setting properties of", name, e))?;
            call("StartUnit", &(name, "replace")).map_err(|e| failed("starting", name, e))?;
            wait_cgroup(name, &path, true)
        }
        Err(e) => Err(failed("starting", name, e)),
    }
}

/// Stops `unit` (a slice stops every unit in it) and waits until its cgroup is gone; a unit
/// systemd does not know is already stopped, and so is one without a cgroup (an active unit
/// always has one): a pod slice no process ever needed — a pod without an infra process or
/// containers — costs no D-Bus call, and systemd no stop job (whose loading of the implicit
/// slice unit and journal lines slowed everything beside it).
pub fn stop(unit: &str, path: &str) -> Result<(), HostError> {
    if !cgroup_exists(path) {
        return Ok(());
    }
    match call("StopUnit", &(unit, "replace")) {
        Ok(()) => {}
        Err(e) if error_name(&e).as_deref() == Some("org.freedesktop.systemd1.NoSuchUnit") => {}
        Err(e) => return Err(failed("stopping", unit, e)),
    }
    wait_cgroup(unit, path, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_expand_as_systemd_does() {
        assert_eq!(expand_slice("-.slice").as_deref(), Some("/"));
        assert_eq!(
            expand_slice("system.slice").as_deref(),
            Some("/system.slice")
        );
        assert_eq!(
            expand_slice("kubepods-burstable-pod1a_2.slice").as_deref(),
            Some("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a_2.slice")
        );
        for bad in [
            "a",
            "-a.slice",
            "a-.slice",
            "a--b.slice",
            ".slice",
            "a/b.slice",
            "a b.slice",
        ] {
            assert_eq!(expand_slice(bad), None, "{bad}");
        }
    }

    #[test]
    fn cgroups_of_either_driver_map_to_their_paths() {
        assert_eq!(
            fs_path("kubepods-besteffort-podx.slice:sandboxd:abc"),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podx.slice/sandboxd-abc.scope"
        );
        assert_eq!(
            unit_of("a-b.slice:sandboxd:abc").as_deref(),
            Some("sandboxd-abc.scope")
        );
        assert_eq!(unit_of("a-b.slice").as_deref(), Some("a-b.slice"));
        assert_eq!(fs_path("a-b.slice"), "/a.slice/a-b.slice");
        assert_eq!(unit_of("/sandboxd/pod-1/sandboxd-2"), None);
        assert_eq!(fs_path("/sandboxd/pod-1"), "/sandboxd/pod-1");
        // Names that would leave the hierarchy map nowhere.
        assert_eq!(fs_path("a.slice:x:../../etc"), "/.invalid-scope");
        assert_eq!(fs_path("a--b.slice"), "/.invalid-slice");
    }

    #[test]
    fn pod_limits_become_unit_properties() {
        use zbus::zvariant::Value;
        let p = slice_properties(&PodLimits {
            memory: 64 << 20,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            cpu_shares: 1024,
        });
        let get = |k: &str| p.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        assert_eq!(get("MemoryMax"), Some(Value::U64(64 << 20)));
        assert_eq!(get("CPUQuotaPerSecUSec"), Some(Value::U64(500_000)));
        assert_eq!(get("CPUQuotaPeriodUSec"), Some(Value::U64(100_000)));
        assert_eq!(get("CPUWeight"), Some(Value::U64(39)));
        let none = slice_properties(&PodLimits::default());
        assert!(none
            .iter()
            .any(|(n, v)| *n == "MemoryMax" && *v == Value::U64(u64::MAX)));
        assert!(!none.iter().any(|(n, _)| *n == "CPUWeight"));
        // No period given: the kernel's default, not 1 µs (which systemd would clamp to 1 ms).
        assert!(none
            .iter()
            .any(|(n, v)| *n == "CPUQuotaPeriodUSec" && *v == Value::U64(100_000)));
    }
}
