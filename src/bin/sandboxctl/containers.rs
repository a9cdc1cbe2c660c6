//! Container commands: `create/start/stop/rm/ps/inspect/logs/exec/stats` over CRI
//! (`exec -i/-t` and `attach` are in `streams.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandboxd::api::v1 as cri;

use crate::config::{load_container_config, load_pod_config};
use crate::output::{ago, pretty_verbose, print_list, short};
use crate::{grpc_err, ids, Runtime};

/// `create POD CONTAINER.json POD.json`, as crictl create.
pub async fn create(
    c: &mut Runtime,
    pod: &str,
    config: &Path,
    pod_config: &Path,
) -> Result<(), String> {
    let pod = ids::pod(c, pod).await?;
    let r = c
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod,
            config: Some(load_container_config(config)?),
            sandbox_config: Some(load_pod_config(pod_config)?),
        })
        .await
        .map_err(|s| grpc_err("CreateContainer", s))?
        .into_inner();
    println!("{}", r.container_id);
    Ok(())
}

pub async fn start(c: &mut Runtime, ids: Vec<String>) -> Result<(), String> {
    for id in ids {
        let id = ids::container(c, &id).await?;
        c.start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .map_err(|s| grpc_err("StartContainer", s))?;
        println!("{id}");
    }
    Ok(())
}

pub async fn stop(c: &mut Runtime, ids: Vec<String>, timeout: i64) -> Result<(), String> {
    for id in ids {
        let id = ids::container(c, &id).await?;
        c.stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout,
        })
        .await
        .map_err(|s| grpc_err("StopContainer", s))?;
        println!("{id}");
    }
    Ok(())
}

pub async fn remove(c: &mut Runtime, ids: Vec<String>) -> Result<(), String> {
    for id in ids {
        let id = ids::container(c, &id).await?;
        c.remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .map_err(|s| grpc_err("RemoveContainer", s))?;
        println!("{id}");
    }
    Ok(())
}

pub async fn ps(
    c: &mut Runtime,
    all: bool,
    pod: Option<String>,
    quiet: bool,
    json: bool,
) -> Result<(), String> {
    let filter = cri::ContainerFilter {
        pod_sandbox_id: pod.unwrap_or_default(),
        state: (!all).then_some(cri::ContainerStateValue {
            state: cri::ContainerState::ContainerRunning as i32,
        }),
        ..Default::default()
    };
    let list = c
        .list_containers(cri::ListContainersRequest {
            filter: Some(filter),
        })
        .await
        .map_err(|s| grpc_err("ListContainers", s))?
        .into_inner()
        .containers;
    if json {
        print_list("containers", &list);
    } else if quiet {
        list.iter().for_each(|x| println!("{}", x.id));
    } else {
        println!(
            "{:<13}  {:<30}  {:<16}  {:<17}  {:<20}  {:<7}  POD ID",
            "CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT"
        );
        for x in list {
            let m = x.metadata.unwrap_or_default();
            let state = cri::ContainerState::try_from(x.state)
                .map(|s| s.as_str_name().to_string())
                .unwrap_or_default();
            println!(
                "{:<13}  {:<30}  {:<16}  {:<17}  {:<20}  {:<7}  {}",
                short(&x.id),
                x.image.map(|i| i.image).unwrap_or_default(),
                ago(x.created_at),
                state,
                m.name,
                m.attempt,
                short(&x.pod_sandbox_id)
            );
        }
    }
    Ok(())
}

pub async fn inspect(c: &mut Runtime, id: &str) -> Result<(), String> {
    let id = ids::container(c, id).await?;
    let s = c
        .container_status(cri::ContainerStatusRequest {
            container_id: id,
            verbose: true,
        })
        .await
        .map_err(|s| grpc_err("ContainerStatus", s))?
        .into_inner();
    println!("{}", pretty_verbose(&s));
    Ok(())
}

/// ExecSync: the command's output as it was, and its exit code as ours.
pub async fn exec_sync(
    c: &mut Runtime,
    id: &str,
    cmd: Vec<String>,
    timeout: i64,
) -> Result<(), String> {
    let id = ids::container(c, id).await?;
    let r = c
        .exec_sync(cri::ExecSyncRequest {
            container_id: id,
            cmd,
            timeout,
        })
        .await
        .map_err(|s| grpc_err("ExecSync", s))?
        .into_inner();
    use std::io::Write;
    let _ = std::io::stdout().write_all(&r.stdout);
    let _ = std::io::stderr().write_all(&r.stderr);
    let _ = std::io::stdout().flush();
    if r.exit_code != 0 {
        std::process::exit(r.exit_code);
    }
    Ok(())
}

/// `stats`: CPU and memory of running containers (of one pod's, with `pod`).
pub async fn stats(c: &mut Runtime, pod: Option<String>, json: bool) -> Result<(), String> {
    let pod = match pod {
        Some(p) => ids::pod(c, &p).await?,
        None => String::new(),
    };
    let stats = c
        .list_container_stats(cri::ListContainerStatsRequest {
            filter: Some(cri::ContainerStatsFilter {
                pod_sandbox_id: pod,
                ..Default::default()
            }),
        })
        .await
        .map_err(|s| grpc_err("ListContainerStats", s))?
        .into_inner()
        .stats;
    if json {
        print_list("stats", &stats);
    } else {
        println!(
            "{:<13}  {:<20}  {:>14}  {:>12}",
            "CONTAINER", "NAME", "CPU (s)", "MEM (MiB)"
        );
        for s in stats {
            let a = s.attributes.unwrap_or_default();
            let cpu = s
                .cpu
                .and_then(|c| c.usage_core_nano_seconds)
                .map_or(0.0, |v| v.value as f64 / 1e9);
            let mem = s
                .memory
                .and_then(|m| m.working_set_bytes)
                .map_or(0.0, |v| v.value as f64 / 1048576.0);
            println!(
                "{:<13}  {:<20}  {:>14.3}  {:>12.1}",
                short(&a.id),
                a.metadata.unwrap_or_default().name,
                cpu,
                mem
            );
        }
    }
    Ok(())
}

/// Prints the container's CRI log (the text of each line), following it with `follow`.
pub async fn logs(c: &mut Runtime, id: &str, follow: bool) -> Result<(), String> {
    let s = ctr_status(c, id).await?;
    if s.log_path.is_empty() {
        return Err(format!("container {id} has no log file (no log_path)"));
    }
    let path = PathBuf::from(&s.log_path);
    let mut offset = 0u64;
    let mut pending = String::new();
    loop {
        // Only what was appended since the last read (from the start again after a rotation).
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if len < offset {
            offset = 0;
        }
        let mut new = Vec::new();
        if let Ok(mut f) = std::fs::File::open(&path) {
            use std::io::{Read, Seek, SeekFrom};
            if f.seek(SeekFrom::Start(offset)).is_ok() {
                let _ = f.read_to_end(&mut new);
            }
        }
        offset += new.len() as u64;
        pending.push_str(&String::from_utf8_lossy(&new));
        while let Some(nl) = pending.find('\n') {
            let line: String = pending.drain(..=nl).collect();
            let mut f = line.trim_end_matches('\n').splitn(4, ' ');
            let (_ts, stream, tag, text) = (f.next(), f.next(), f.next(), f.next().unwrap_or(""));
            let out = if tag == Some("P") {
                text.to_string()
            } else {
                format!("{text}\n")
            };
            if stream == Some("stderr") {
                eprint!("{out}");
            } else {
                print!("{out}");
            }
        }
        if !follow {
            return Ok(());
        }
        if ctr_status(c, id).await?.state != cri::ContainerState::ContainerRunning as i32 {
            // One last read after the exit, then stop.
            tokio::time::sleep(Duration::from_millis(100)).await;
            if std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) == offset {
                return Ok(());
            }
            continue;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// ContainerStatus of `id` (not verbose).
async fn ctr_status(c: &mut Runtime, id: &str) -> Result<cri::ContainerStatus, String> {
    Ok(c.container_status(cri::ContainerStatusRequest {
        container_id: id.to_string(),
        verbose: false,
    })
    .await
    .map_err(|s| grpc_err("ContainerStatus", s))?
    .into_inner()
    .status
    .unwrap_or_default())
}
