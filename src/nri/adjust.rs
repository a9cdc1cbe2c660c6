//! Plugins' adjustments of a container being created, applied to its OCI spec (as JSON, the
//! runtime-spec's own field names) one plugin after the other, so each plugin sees what the
//! ones before it did. Each field (or, for maps and lists, each key) has one owner: a second
//! plugin setting it is a conflict, and the creation fails naming both. A key prefixed with
//! `-` removes the entry (and makes the remover its owner, free to set it again).

use std::collections::HashMap;

use sandboxd_nri_api::api;
use serde_json::{json, Map, Value};

/// Who set what, for one container.
#[derive(Default)]
pub(crate) struct Owners {
    owner: HashMap<(String, String), String>,
}

impl Owners {
    /// `plugin` sets `field[key]` (`key` empty for a plain field).
    fn claim(&mut self, field: &str, key: &str, plugin: &str) -> Result<(), String> {
        let k = (field.to_string(), key.to_string());
        match self.owner.get(&k) {
            Some(o) if o != plugin && o.strip_prefix('-') != Some(plugin) => {
                let what = if key.is_empty() {
                    field.to_string()
                } else {
                    format!("{field} {key:?}")
                };
                Err(format!(
                    "NRI plugins {} and {plugin} both tried to set {what}",
                    o.trim_start_matches('-')
                ))
            }
            _ => {
                self.owner.insert(k, plugin.to_string());
                Ok(())
            }
        }
    }

    /// `plugin` removes `field[key]`.
    fn remove(&mut self, field: &str, key: &str, plugin: &str) -> Result<(), String> {
        self.claim(field, key, plugin)?;
        self.owner
            .insert((field.into(), key.into()), format!("-{plugin}"));
        Ok(())
    }

    /// A plain field set again without conflict (a leading `""` in args).
    fn release(&mut self, field: &str) {
        self.owner.remove(&(field.to_string(), String::new()));
    }
}

fn obj<'a>(v: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    let o = v.as_object_mut().expect("an object");
    let e = o.entry(key).or_insert_with(|| json!({}));
    if !e.is_object() {
        *e = json!({});
    }
    e.as_object_mut().expect("an object")
}

fn arr<'a>(v: &'a mut Value, key: &str) -> &'a mut Vec<Value> {
    let o = v.as_object_mut().expect("an object");
    let e = o.entry(key).or_insert_with(|| json!([]));
    if !e.is_array() {
        *e = json!([]);
    }
    e.as_array_mut().expect("an array")
}

/// The most entries of each kind one plugin's adjustment of one container may hold: far
/// above what any plugin sets (a plugin's answer is bounded in bytes by the message limit,
/// and these bound the work of applying it).
pub(crate) const MAX_ENTRIES: usize = 4096;

/// Refuses an adjustment with more than [`MAX_ENTRIES`] entries of any kind.
fn check_size(a: &api::ContainerAdjustment) -> Result<(), String> {
    let hooks = a.hooks.as_ref().map_or(0, |h| {
        h.prestart.len()
            + h.create_runtime.len()
            + h.create_container.len()
            + h.start_container.len()
            + h.poststart.len()
            + h.poststop.len()
    });
    let linux = a.linux.as_ref();
    let counts = [
        ("annotations", a.annotations.len()),
        ("mounts", a.mounts.len()),
        ("env", a.env.len()),
        ("args", a.args.len()),
        ("hooks", hooks),
        ("rlimits", a.rlimits.len()),
        ("CDI devices", a.cdi_devices.len()),
        ("linux.devices", linux.map_or(0, |l| l.devices.len())),
        ("linux.namespaces", linux.map_or(0, |l| l.namespaces.len())),
        ("linux.sysctl", linux.map_or(0, |l| l.sysctl.len())),
    ];
    match counts.iter().find(|(_, n)| *n > MAX_ENTRIES) {
        Some((what, n)) => Err(format!(
            "the adjustment holds {n} {what}, more than the {MAX_ENTRIES} allowed"
        )),
        None => Ok(()),
    }
}

/// Applies, in one pass, what a list of keyed entries (env by name, mounts by destination)
/// becomes after `ops` in order, each removing every entry of its key and, with a value,
/// adding it at the end: entries no op names keep their place, and each key set last is
/// appended in the order of its last op. Linear in the list and the ops (one op at a time
/// was quadratic: 80,000 env vars took half a minute).
fn replace_keyed(
    list: &mut Vec<Value>,
    ops: Vec<(String, Option<Value>)>,
    key_of: impl Fn(&Value) -> Option<String>,
) {
    let mut last: HashMap<String, usize> = HashMap::with_capacity(ops.len());
    for (i, (k, _)) in ops.iter().enumerate() {
        last.insert(k.clone(), i);
    }
    list.retain(|x| key_of(x).is_none_or(|k| !last.contains_key(&k)));
    for (i, (k, v)) in ops.into_iter().enumerate() {
        if let Some(v) = v.filter(|_| last.get(&k) == Some(&i)) {
            list.push(v);
        }
    }
}

/// Applies `plugin`'s adjustment to `spec`; returns the CDI devices it asks for (applied by
/// the caller through the node's CDI registry).
pub(crate) fn apply(
    spec: &mut Value,
    a: &api::ContainerAdjustment,
    plugin: &str,
    owners: &mut Owners,
) -> Result<Vec<String>, String> {
    check_size(a)?;
    for (k, v) in &a.annotations {
        let annotations = obj(spec, "annotations");
        match k.strip_prefix('-') {
            Some(k) => {
                owners.remove("annotation", k, plugin)?;
                annotations.remove(k);
            }
            None => {
                owners.claim("annotation", k, plugin)?;
                annotations.insert(k.clone(), json!(v));
            }
        }
    }
    let mut mount_ops = Vec::with_capacity(a.mounts.len());
    for m in &a.mounts {
        match m.destination.strip_prefix('-') {
            Some(d) => {
                owners.remove("mount", d, plugin)?;
                mount_ops.push((d.to_string(), None));
            }
            None => {
                if !m.destination.starts_with('/') {
                    return Err(format!(
                        "mount destination {:?} is not absolute",
                        m.destination
                    ));
                }
                owners.claim("mount", &m.destination, plugin)?;
                mount_ops.push((
                    m.destination.clone(),
                    Some(json!({
                        "destination": m.destination,
                        "type": m.r#type,
                        "source": m.source,
                        "options": m.options,
                    })),
                ));
            }
        }
    }
    if !mount_ops.is_empty() {
        replace_keyed(arr(spec, "mounts"), mount_ops, |x| {
            x["destination"].as_str().map(str::to_string)
        });
    }
    let mut env_ops = Vec::with_capacity(a.env.len());
    for kv in &a.env {
        let (key, removal) = match kv.key.strip_prefix('-') {
            Some(k) => (k, true),
            None => (kv.key.as_str(), false),
        };
        if key.is_empty() || key.contains('=') {
            return Err(format!("invalid environment variable name {key:?}"));
        }
        if removal {
            owners.remove("env", key, plugin)?;
            env_ops.push((key.to_string(), None));
        } else {
            owners.claim("env", key, plugin)?;
            env_ops.push((key.to_string(), Some(json!(format!("{key}={}", kv.value)))));
        }
    }
    if !env_ops.is_empty() {
        let env = obj(spec, "process")
            .entry("env")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or("process.env is not a list")?;
        replace_keyed(env, env_ops, |e| {
            e.as_str()
                .and_then(|e| e.split_once('='))
                .map(|(k, _)| k.to_string())
        });
    }
    if let Some(h) = &a.hooks {
        for (kind, list) in [
            ("prestart", &h.prestart),
            ("createRuntime", &h.create_runtime),
            ("createContainer", &h.create_container),
            ("startContainer", &h.start_container),
            ("poststart", &h.poststart),
            ("poststop", &h.poststop),
        ] {
            for hook in list {
                if !hook.path.starts_with('/') {
                    return Err(format!("hook path {:?} is not absolute", hook.path));
                }
                let mut v = json!({"path": hook.path, "args": hook.args, "env": hook.env});
                if let Some(t) = &hook.timeout {
                    v["timeout"] = json!(t.value);
                }
                let hooks = obj(spec, "hooks");
                hooks
                    .entry(kind)
                    .or_insert_with(|| json!([]))
                    .as_array_mut()
                    .ok_or("hooks are not lists")?
                    .push(v);
            }
        }
    }
    for r in &a.rlimits {
        if !r.r#type.starts_with("RLIMIT_") {
            return Err(format!("unknown rlimit {:?}", r.r#type));
        }
        owners.claim("rlimit", &r.r#type, plugin)?;
        let process = obj(spec, "process");
        let list = process
            .entry("rlimits")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or("process.rlimits is not a list")?;
        list.retain(|x| x["type"] != r.r#type.as_str());
        list.push(json!({"type": r.r#type, "hard": r.hard, "soft": r.soft}));
    }
    let mut cdi = Vec::new();
    for d in &a.cdi_devices {
        owners.claim("CDI device", &d.name, plugin)?;
        cdi.push(d.name.clone());
    }
    if !a.args.is_empty() {
        let args = if a.args[0].is_empty() {
            owners.release("args");
            &a.args[1..]
        } else {
            &a.args[..]
        };
        owners.claim("args", "", plugin)?;
        if args.is_empty() {
            return Err("empty args".into());
        }
        obj(spec, "process").insert("args".into(), json!(args));
    }
    if let Some(l) = &a.linux {
        linux(spec, l, plugin, owners)?;
    }
    Ok(cdi)
}

fn linux(
    spec: &mut Value,
    l: &api::LinuxContainerAdjustment,
    plugin: &str,
    owners: &mut Owners,
) -> Result<(), String> {
    let unsupported = [
        ("io_priority", l.io_priority.is_some()),
        ("seccomp_policy", l.seccomp_policy.is_some()),
        ("net_devices", !l.net_devices.is_empty()),
        ("scheduler", l.scheduler.is_some()),
        ("rdt", l.rdt.is_some()),
        ("memory_policy", l.memory_policy.is_some()),
    ];
    if let Some((what, _)) = unsupported.iter().find(|(_, set)| *set) {
        return Err(format!(
            "adjusting linux.{what} is not supported by sandboxd"
        ));
    }
    for d in &l.devices {
        let linux = obj(spec, "linux");
        let list = linux
            .entry("devices")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or("linux.devices is not a list")?;
        match d.path.strip_prefix('-') {
            Some(p) => {
                owners.remove("device", p, plugin)?;
                list.retain(|x| x["path"] != p);
            }
            None => {
                if !d.path.starts_with("/dev/")
                    || !["c", "b", "u", "p"].contains(&d.r#type.as_str())
                {
                    return Err(format!("device {:?} of type {:?}", d.path, d.r#type));
                }
                owners.claim("device", &d.path, plugin)?;
                list.retain(|x| x["path"] != d.path.as_str());
                let mut v =
                    json!({"path": d.path, "type": d.r#type, "major": d.major, "minor": d.minor});
                if let Some(m) = &d.file_mode {
                    v["fileMode"] = json!(m.value);
                }
                if let Some(u) = &d.uid {
                    v["uid"] = json!(u.value);
                }
                if let Some(g) = &d.gid {
                    v["gid"] = json!(g.value);
                }
                list.push(v);
                // And the device cgroup lets the container use it.
                let res = obj(obj_value(spec, "linux"), "resources");
                res.entry("devices")
                    .or_insert_with(|| json!([]))
                    .as_array_mut()
                    .ok_or("linux.resources.devices is not a list")?
                    .push(json!({"allow": true, "type": d.r#type, "major": d.major, "minor": d.minor, "access": "rwm"}));
            }
        }
    }
    if let Some(r) = &l.resources {
        resources(spec, r, plugin, owners)?;
    }
    if !l.cgroups_path.is_empty() {
        check_cgroups_path(&l.cgroups_path)?;
        owners.claim("cgroups path", "", plugin)?;
        obj(spec, "linux").insert("cgroupsPath".into(), json!(l.cgroups_path));
    }
    if let Some(o) = &l.oom_score_adj {
        if !(-1000..=1000).contains(&o.value) {
            return Err(format!("oom_score_adj {} out of range", o.value));
        }
        owners.claim("oom_score_adj", "", plugin)?;
        obj(spec, "process").insert("oomScoreAdj".into(), json!(o.value));
    }
    for n in &l.namespaces {
        let linux = obj(spec, "linux");
        let list = linux
            .entry("namespaces")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or("linux.namespaces is not a list")?;
        match n.r#type.strip_prefix('-') {
            Some(t) => {
                owners.remove("namespace", t, plugin)?;
                list.retain(|x| x["type"] != t);
            }
            None => {
                owners.claim("namespace", &n.r#type, plugin)?;
                list.retain(|x| x["type"] != n.r#type.as_str());
                let mut v = json!({"type": n.r#type});
                if !n.path.is_empty() {
                    v["path"] = json!(n.path);
                }
                list.push(v);
            }
        }
    }
    for (k, v) in &l.sysctl {
        owners.claim("sysctl", k, plugin)?;
        obj(obj_value(spec, "linux"), "sysctl").insert(k.clone(), json!(v));
    }
    Ok(())
}

/// A cgroups path a plugin may give: a cgroupfs path (absolute, no `.`/`..`, no empty
/// part) or a systemd `slice:prefix:name` (each part a plain name).
fn check_cgroups_path(p: &str) -> Result<(), String> {
    let plain = |s: &str| {
        !s.is_empty()
            && s.len() <= 255
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
            && s != "."
            && s != ".."
    };
    let ok = match p.split(':').collect::<Vec<_>>()[..] {
        [path] => path.starts_with('/') && path[1..].split('/').all(plain),
        [slice, prefix, name] => {
            plain(slice) && slice.ends_with(".slice") && plain(prefix) && plain(name)
        }
        _ => false,
    };
    if !ok || p.len() > 4096 {
        return Err(format!(
            "cgroups path {p:?} is neither an absolute cgroupfs path nor slice:prefix:name"
        ));
    }
    Ok(())
}

fn obj_value<'a>(v: &'a mut Value, key: &str) -> &'a mut Value {
    obj(v, key);
    &mut v[key]
}

fn resources(
    spec: &mut Value,
    r: &api::LinuxResources,
    plugin: &str,
    owners: &mut Owners,
) -> Result<(), String> {
    if r.blockio_class.is_some() || r.rdt_class.is_some() {
        return Err("adjusting the block I/O or RDT class is not supported by sandboxd".into());
    }
    let res = obj_value(obj_value(spec, "linux"), "resources");
    if let Some(m) = &r.memory {
        let mem = obj(res, "memory");
        let fields: [(&str, &str, Option<Value>); 6] = [
            (
                "memory limit",
                "limit",
                m.limit.as_ref().map(|v| json!(v.value)),
            ),
            (
                "memory reservation",
                "reservation",
                m.reservation.as_ref().map(|v| json!(v.value)),
            ),
            (
                "memory swap",
                "swap",
                m.swap.as_ref().map(|v| json!(v.value)),
            ),
            (
                "memory swappiness",
                "swappiness",
                m.swappiness.as_ref().map(|v| json!(v.value)),
            ),
            (
                "memory OOM killer",
                "disableOOMKiller",
                m.disable_oom_killer.as_ref().map(|v| json!(v.value)),
            ),
            (
                "memory kernel limit",
                "kernel",
                m.kernel.as_ref().map(|v| json!(v.value)),
            ),
        ];
        for (name, key, v) in fields {
            if let Some(v) = v {
                owners.claim(name, "", plugin)?;
                mem.insert(key.into(), v);
            }
        }
    }
    if let Some(c) = &r.cpu {
        let cpu = obj(res, "cpu");
        let fields: [(&str, &str, Option<Value>); 7] = [
            (
                "CPU shares",
                "shares",
                c.shares.as_ref().map(|v| json!(v.value)),
            ),
            (
                "CPU quota",
                "quota",
                c.quota.as_ref().map(|v| json!(v.value)),
            ),
            (
                "CPU period",
                "period",
                c.period.as_ref().map(|v| json!(v.value)),
            ),
            (
                "CPU realtime runtime",
                "realtimeRuntime",
                c.realtime_runtime.as_ref().map(|v| json!(v.value)),
            ),
            (
                "CPU realtime period",
                "realtimePeriod",
                c.realtime_period.as_ref().map(|v| json!(v.value)),
            ),
            (
                "cpuset CPUs",
                "cpus",
                (!c.cpus.is_empty()).then(|| json!(c.cpus)),
            ),
            (
                "cpuset memory nodes",
                "mems",
                (!c.mems.is_empty()).then(|| json!(c.mems)),
            ),
        ];
        for (name, key, v) in fields {
            if let Some(v) = v {
                if let Some(s) = v.as_str() {
                    if !s
                        .bytes()
                        .all(|b| b.is_ascii_digit() || b == b',' || b == b'-')
                    {
                        return Err(format!("{name} {s:?} is not a cpuset list"));
                    }
                }
                owners.claim(name, "", plugin)?;
                cpu.insert(key.into(), v);
            }
        }
    }
    for h in &r.hugepage_limits {
        owners.claim("hugepage limit", &h.page_size, plugin)?;
        let list = res
            .as_object_mut()
            .expect("an object")
            .entry("hugepageLimits")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or("hugepageLimits is not a list")?;
        list.retain(|x| x["pageSize"] != h.page_size.as_str());
        list.push(json!({"pageSize": h.page_size, "limit": h.limit}));
    }
    for (k, v) in &r.unified {
        let mut check = crate::model::resources::Resources::default();
        check.unified.insert(k.clone(), v.clone());
        check
            .check(crate::oci::spec::cgroup_v2_only())
            .map_err(|e| e.to_string())?;
        owners.claim("unified", k, plugin)?;
        obj(res, "unified").insert(k.clone(), json!(v));
    }
    if let Some(p) = &r.pids {
        owners.claim("pids limit", "", plugin)?;
        obj(res, "pids").insert("limit".into(), json!(p.limit));
    }
    for d in &r.devices {
        let mut v = json!({"allow": d.allow, "type": d.r#type, "access": d.access});
        if let Some(m) = &d.major {
            v["major"] = json!(m.value);
        }
        if let Some(m) = &d.minor {
            v["minor"] = json!(m.value);
        }
        res.as_object_mut()
            .expect("an object")
            .entry("devices")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or("linux.resources.devices is not a list")?
            .push(v);
    }
    Ok(())
}

/// `a` added to `merged`, the adjustments of all plugins as validators see them: maps and
/// lists gathered, plain fields as the later plugin set them.
pub(crate) fn merge_into(merged: &mut api::ContainerAdjustment, a: &api::ContainerAdjustment) {
    merged.annotations.extend(a.annotations.clone());
    merged.mounts.extend(a.mounts.iter().cloned());
    merged.env.extend(a.env.iter().cloned());
    merged.rlimits.extend(a.rlimits.iter().cloned());
    merged.cdi_devices.extend(a.cdi_devices.iter().cloned());
    if !a.args.is_empty() {
        merged.args = a.args.clone();
    }
    if let Some(h) = &a.hooks {
        let m = merged.hooks.get_or_insert_with(Default::default);
        m.prestart.extend(h.prestart.iter().cloned());
        m.create_runtime.extend(h.create_runtime.iter().cloned());
        m.create_container
            .extend(h.create_container.iter().cloned());
        m.start_container.extend(h.start_container.iter().cloned());
        m.poststart.extend(h.poststart.iter().cloned());
        m.poststop.extend(h.poststop.iter().cloned());
    }
    if let Some(l) = &a.linux {
        let m = merged.linux.get_or_insert_with(Default::default);
        m.devices.extend(l.devices.iter().cloned());
        m.namespaces.extend(l.namespaces.iter().cloned());
        m.sysctl.extend(l.sysctl.clone());
        if l.resources.is_some() {
            m.resources = l.resources.clone();
        }
        if l.oom_score_adj.is_some() {
            m.oom_score_adj = l.oom_score_adj;
        }
    }
}

/// For the fuzz target: a plugin's CreateContainer answer (protobuf) applied, as two plugins
/// would, to a container's spec, and the result read back as an OCI spec the way the daemon
/// does. Never panics; errors are the plugin's refusals.
#[doc(hidden)]
pub fn fuzz_adjustment(answer: &[u8]) {
    use sandboxd_nri_api::prost::Message;
    let Ok(reply) = api::CreateContainerResponse::decode(answer) else {
        return;
    };
    let Some(a) = reply.adjust else {
        return;
    };
    let mut spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": ["PATH=/bin"], "cwd": "/"},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"namespaces": [{"type": "mount"}]}
    });
    let mut owners = Owners::default();
    for plugin in ["10-one", "20-two"] {
        if apply(&mut spec, &a, plugin, &mut owners).is_err() {
            return;
        }
        let _ = serde_json::from_value::<oci_spec::runtime::Spec>(spec.clone());
    }
}

#[cfg(test)]
mod tests;
