//! Records and OCI specs as NRI sees them, and NRI's resources as the daemon's.

use std::collections::HashMap;

use sandboxd_nri_api::api;
use serde_json::Value;

use crate::config::Config;
use crate::model::container::{ContainerRecord, ContainerState};
use crate::model::resources::Resources;
use crate::model::sandbox::SandboxRecord;

fn map(m: &std::collections::BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A pod as plugins see it.
pub(crate) fn pod(r: &SandboxRecord, cfg: &Config) -> api::PodSandbox {
    let cgroup = r.pod_cgroup(cfg);
    let namespaces = [("network", &r.netns), ("ipc", &r.ipcns), ("uts", &r.utsns)]
        .into_iter()
        .filter_map(|(t, p)| {
            p.as_ref().map(|p| api::LinuxNamespace {
                r#type: t.into(),
                path: p.to_string_lossy().into_owned(),
            })
        })
        .collect();
    api::PodSandbox {
        id: r.id.clone(),
        name: r.config.metadata.name.clone(),
        uid: r.config.metadata.uid.clone(),
        namespace: r.config.metadata.namespace.clone(),
        labels: map(&r.config.labels),
        annotations: map(&r.config.annotations),
        runtime_handler: r.runtime_handler.clone(),
        linux: Some(api::LinuxPodSandbox {
            pod_overhead: r.config.overhead.as_ref().map(resources),
            pod_resources: r.config.resources.as_ref().map(resources),
            cgroup_parent: cgroup.clone(),
            cgroups_path: cgroup,
            namespaces,
            resources: r.config.resources.as_ref().map(resources),
        }),
        pid: r
            .infra
            .as_ref()
            .filter(|i| i.started && !i.stopped)
            .map_or(0, |i| i.pid.max(0) as u32),
        ips: r.network.ips.clone(),
    }
}

/// A container as plugins see it, from its record (events after creation).
pub(crate) fn container(r: &ContainerRecord) -> api::Container {
    let state = match r.state {
        ContainerState::Creating | ContainerState::Unknown => api::ContainerState::ContainerUnknown,
        ContainerState::Created => api::ContainerState::ContainerCreated,
        ContainerState::Running => api::ContainerState::ContainerRunning,
        ContainerState::Exited => api::ContainerState::ContainerStopped,
    };
    api::Container {
        id: r.id.clone(),
        pod_sandbox_id: r.sandbox_id.clone(),
        name: r.config.metadata.name.clone(),
        state: state as i32,
        labels: map(&r.config.labels),
        annotations: map(&r.config.annotations),
        args: r
            .config
            .command
            .iter()
            .chain(&r.config.args)
            .cloned()
            .collect(),
        env: r
            .config
            .envs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
        pid: r.pid.max(0) as u32,
        created_at: r.created_at,
        started_at: r.started_at,
        finished_at: r.finished_at,
        exit_code: r.exit_code,
        status_reason: r.reason.clone(),
        status_message: r.message.clone(),
        cdi_devices: r
            .config
            .cdi_devices
            .iter()
            .map(|n| api::CdiDevice { name: n.clone() })
            .collect(),
        user: r.user.as_ref().map(|u| api::User {
            uid: u.uid,
            gid: u.gid,
            additional_gids: u.supplemental_groups.clone(),
        }),
        ..Default::default()
    }
}

/// A container after CreateContainer, as plugins see it in every later event and in a
/// Synchronize: its OCI spec as the plugins' adjustments left it (the bundle's
/// `config.json`: args, env, mounts, annotations, rlimits…), with the record's state and
/// times — so a plugin sees what it set. The record alone while no spec is written yet.
pub(crate) fn created(r: &ContainerRecord) -> api::Container {
    match crate::oci::spec::read_bundle(&r.dir) {
        Ok(spec) => api::Container {
            state: container(r).state,
            ..creating(r, &spec)
        },
        Err(_) => container(r),
    }
}

/// A container being created, as plugins see it: the record's identity and the OCI spec
/// built for it (as the plugins before this one left it).
pub(crate) fn creating(r: &ContainerRecord, spec: &Value) -> api::Container {
    let mut c = container(r);
    c.state = api::ContainerState::ContainerUnknown as i32;
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(s).collect())
            .unwrap_or_default()
    };
    let p = &spec["process"];
    c.args = strings(&p["args"]);
    c.env = strings(&p["env"]);
    c.annotations = spec["annotations"]
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.clone(), s(v))).collect())
        .unwrap_or_default();
    c.mounts = spec["mounts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| api::Mount {
                    destination: s(&m["destination"]),
                    r#type: s(&m["type"]),
                    source: s(&m["source"]),
                    options: strings(&m["options"]),
                })
                .collect()
        })
        .unwrap_or_default();
    c.rlimits = p["rlimits"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| api::PosixRlimit {
                    r#type: s(&r["type"]),
                    hard: r["hard"].as_u64().unwrap_or_default(),
                    soft: r["soft"].as_u64().unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    let hooks = |k: &str| -> Vec<api::Hook> {
        spec["hooks"][k]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|h| api::Hook {
                        path: s(&h["path"]),
                        args: strings(&h["args"]),
                        env: strings(&h["env"]),
                        timeout: h["timeout"].as_i64().map(|t| api::OptionalInt { value: t }),
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    c.hooks = Some(api::Hooks {
        prestart: hooks("prestart"),
        create_runtime: hooks("createRuntime"),
        create_container: hooks("createContainer"),
        start_container: hooks("startContainer"),
        poststart: hooks("poststart"),
        poststop: hooks("poststop"),
    });
    let l = &spec["linux"];
    c.linux = Some(api::LinuxContainer {
        namespaces: l["namespaces"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|n| api::LinuxNamespace {
                        r#type: s(&n["type"]),
                        path: s(&n["path"]),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        devices: l["devices"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|d| api::LinuxDevice {
                        path: s(&d["path"]),
                        r#type: s(&d["type"]),
                        major: d["major"].as_i64().unwrap_or_default(),
                        minor: d["minor"].as_i64().unwrap_or_default(),
                        file_mode: d["fileMode"]
                            .as_u64()
                            .map(|v| api::OptionalFileMode { value: v as u32 }),
                        uid: d["uid"]
                            .as_u64()
                            .map(|v| api::OptionalUInt32 { value: v as u32 }),
                        gid: d["gid"]
                            .as_u64()
                            .map(|v| api::OptionalUInt32 { value: v as u32 }),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        resources: Some(spec_resources(&l["resources"])),
        oom_score_adj: p["oomScoreAdj"]
            .as_i64()
            .map(|v| api::OptionalInt { value: v }),
        cgroups_path: s(&l["cgroupsPath"]),
        sysctl: l["sysctl"]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), s(v))).collect())
            .unwrap_or_default(),
        ..Default::default()
    });
    c
}

fn spec_resources(r: &Value) -> api::LinuxResources {
    let i64v = |v: &Value| v.as_i64().map(|value| api::OptionalInt64 { value });
    let u64v = |v: &Value| v.as_u64().map(|value| api::OptionalUInt64 { value });
    let m = &r["memory"];
    let c = &r["cpu"];
    api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: i64v(&m["limit"]),
            reservation: i64v(&m["reservation"]),
            swap: i64v(&m["swap"]),
            swappiness: u64v(&m["swappiness"]),
            ..Default::default()
        }),
        cpu: Some(api::LinuxCpu {
            shares: u64v(&c["shares"]),
            quota: i64v(&c["quota"]),
            period: u64v(&c["period"]),
            cpus: c["cpus"].as_str().unwrap_or_default().into(),
            mems: c["mems"].as_str().unwrap_or_default().into(),
            ..Default::default()
        }),
        hugepage_limits: r["hugepageLimits"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|h| api::HugepageLimit {
                        page_size: h["pageSize"].as_str().unwrap_or_default().into(),
                        limit: h["limit"].as_u64().unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        unified: r["unified"]
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().into()))
                    .collect()
            })
            .unwrap_or_default(),
        pids: r["pids"]["limit"]
            .as_i64()
            .map(|limit| api::LinuxPids { limit }),
        ..Default::default()
    }
}

/// The daemon's resources as NRI's.
pub(crate) fn resources(r: &Resources) -> api::LinuxResources {
    let some_i = |v: i64| (v != 0).then_some(api::OptionalInt64 { value: v });
    let some_u = |v: i64| (v > 0).then_some(api::OptionalUInt64 { value: v as u64 });
    api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: some_i(r.memory_limit_in_bytes),
            swap: some_i(r.memory_swap_limit_in_bytes),
            ..Default::default()
        }),
        cpu: Some(api::LinuxCpu {
            shares: some_u(r.cpu_shares),
            quota: some_i(r.cpu_quota),
            period: some_u(r.cpu_period),
            cpus: r.cpuset_cpus.clone(),
            mems: r.cpuset_mems.clone(),
            ..Default::default()
        }),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|(s, l)| api::HugepageLimit {
                page_size: s.clone(),
                limit: *l,
            })
            .collect(),
        unified: r
            .unified
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

/// NRI's resources laid over the daemon's (what an update from a plugin asks for): each
/// field it sets replaces ours, the others stay. Fields the daemon cannot update in place
/// are refused by name.
pub(crate) fn update_resources(
    base: &Resources,
    u: &api::LinuxResources,
) -> Result<Resources, String> {
    let mut r = base.clone();
    if let Some(m) = &u.memory {
        if let Some(v) = &m.limit {
            r.memory_limit_in_bytes = v.value;
        }
        if let Some(v) = &m.swap {
            r.memory_swap_limit_in_bytes = v.value;
        }
        if m.reservation.is_some() || m.kernel.is_some() || m.kernel_tcp.is_some() {
            return Err("memory reservation and kernel limits are not supported".into());
        }
    }
    if let Some(c) = &u.cpu {
        if let Some(v) = &c.shares {
            r.cpu_shares = v.value as i64;
        }
        if let Some(v) = &c.quota {
            r.cpu_quota = v.value;
        }
        if let Some(v) = &c.period {
            r.cpu_period = v.value as i64;
        }
        if !c.cpus.is_empty() {
            r.cpuset_cpus = c.cpus.clone();
        }
        if !c.mems.is_empty() {
            r.cpuset_mems = c.mems.clone();
        }
        if c.realtime_runtime.is_some() || c.realtime_period.is_some() {
            return Err("realtime CPU limits are not supported".into());
        }
    }
    for h in &u.hugepage_limits {
        r.hugepage_limits.retain(|(s, _)| s != &h.page_size);
        r.hugepage_limits.push((h.page_size.clone(), h.limit));
    }
    for (k, v) in &u.unified {
        r.unified.insert(k.clone(), v.clone());
    }
    Ok(r)
}
