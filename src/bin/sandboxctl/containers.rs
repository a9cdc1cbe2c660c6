//! Container and image commands: `create/start/stop/rm/ps/inspect/logs/exec` over CRI, and
//! `images` (list, inspect, remove over CRI; `import` into a local store directly, since the
//! CRI has no import call).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Subcommand;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use super::{ago, grpc_err, print_list, short};

#[derive(Subcommand, Debug)]
pub enum ImagesCmd {
    /// List images.
    List {
        #[arg(long, short)]
        quiet: bool,
    },
    /// Import an OCI image layout dir, an oci-archive or a docker-archive tar into the local
    /// store of a sandboxd state root (run on the node, as root).
    Import {
        file: PathBuf,
        /// Tag for an archive that names no image.
        #[arg(long)]
        name: Option<String>,
        /// The daemon's state root.
        #[arg(long, default_value = "/var/lib/sandboxd")]
        root: PathBuf,
    },
    /// Image status (verbose).
    Inspect { image: String },
    /// Remove images.
    Rm { images: Vec<String> },
}

pub fn images_client(ch: &Channel) -> ImageServiceClient<Channel> {
    ImageServiceClient::new(ch.clone())
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20)
}

/// `images import` needs no daemon: it writes the store under the state root (the store's
/// index is locked, so a running daemon sees the image on its next call).
pub fn import(file: &Path, name: Option<&str>, root: &Path) -> Result<(), String> {
    let store = sandboxd::image::ImageStore::new(root.join("images")).map_err(|e| e.to_string())?;
    for img in store.import(file, name).map_err(|e| e.to_string())? {
        println!(
            "Imported {} {}",
            img.id,
            img.repo_tags.first().map(String::as_str).unwrap_or("")
        );
    }
    Ok(())
}

pub async fn images(ch: &Channel, cmd: ImagesCmd, json: bool) -> Result<(), String> {
    let mut c = images_client(ch);
    match cmd {
        ImagesCmd::Import { .. } => unreachable!("handled without a connection"),
        ImagesCmd::List { quiet } => {
            let images = c
                .list_images(cri::ListImagesRequest { filter: None })
                .await
                .map_err(|s| grpc_err("ListImages", s))?
                .into_inner()
                .images;
            if json {
                print_list("images", &images);
            } else if quiet {
                images.iter().for_each(|i| println!("{}", i.id));
            } else {
                println!("{:<50}  {:<13}  SIZE", "IMAGE", "IMAGE ID");
                for i in images {
                    let id = i.id.trim_start_matches("sha256:");
                    let names = if i.repo_tags.is_empty() {
                        vec!["<none>".to_string()]
                    } else {
                        i.repo_tags.clone()
                    };
                    for n in names {
                        println!("{:<50}  {:<13}  {:.1}MB", n, short(id), i.size as f64 / 1e6);
                    }
                }
            }
        }
        ImagesCmd::Inspect { image } => {
            let r = c
                .image_status(cri::ImageStatusRequest {
                    image: Some(cri::ImageSpec {
                        image: image.clone(),
                        ..Default::default()
                    }),
                    verbose: true,
                })
                .await
                .map_err(|s| grpc_err("ImageStatus", s))?
                .into_inner();
            if r.image.is_none() {
                return Err(format!("no such image: {image}"));
            }
            println!("{}", pretty_verbose(&r));
        }
        ImagesCmd::Rm { images } => {
            for image in images {
                c.remove_image(cri::RemoveImageRequest {
                    image: Some(cri::ImageSpec {
                        image: image.clone(),
                        ..Default::default()
                    }),
                })
                .await
                .map_err(|s| grpc_err("RemoveImage", s))?;
                println!("Deleted: {image}");
            }
        }
    }
    Ok(())
}

/// JSON with the verbose `info` values (JSON documents in strings) shown as JSON.
pub fn pretty_verbose<T: serde::Serialize>(r: &T) -> String {
    let mut v = serde_json::to_value(r).unwrap();
    if let Some(info) = v.get_mut("info").and_then(|i| i.as_object_mut()) {
        for val in info.values_mut() {
            if let Some(parsed) = val
                .as_str()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
            {
                *val = parsed;
            }
        }
    }
    serde_json::to_string_pretty(&v).unwrap()
}

/// Resolves a container id prefix against ListContainers; no match passes it on unchanged.
pub async fn resolve_container(
    c: &mut RuntimeServiceClient<Channel>,
    prefix: &str,
) -> Result<String, String> {
    let items = c
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .map_err(|s| grpc_err("ListContainers", s))?
        .into_inner()
        .containers;
    super::pick(items.into_iter().map(|c| c.id), prefix, "containers")
}

pub async fn ps(
    c: &mut RuntimeServiceClient<Channel>,
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

/// Prints the container's CRI log (the text of each line), following it with `follow`.
pub async fn logs(
    c: &mut RuntimeServiceClient<Channel>,
    id: &str,
    follow: bool,
) -> Result<(), String> {
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
async fn ctr_status(
    c: &mut RuntimeServiceClient<Channel>,
    id: &str,
) -> Result<cri::ContainerStatus, String> {
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
