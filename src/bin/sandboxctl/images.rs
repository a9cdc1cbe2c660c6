//! Image commands: `pull`, and `images` (list, inspect, remove over CRI; `import` into a local
//! store directly, since the CRI has no import call).

use std::path::Path;

use sandboxd::api::v1 as cri;
use sandboxd::api::v1::image_service_client::ImageServiceClient;
use tonic::transport::Channel;

use crate::cli::ImagesCmd;
use crate::grpc_err;
use crate::output::{pretty_verbose, print_list, short};

fn images_client(ch: &Channel) -> ImageServiceClient<Channel> {
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

/// PullImage, with registry credentials `user[:password]` or a registry token.
pub async fn pull(
    ch: &Channel,
    image: String,
    creds: Option<String>,
    registry_token: Option<String>,
) -> Result<(), String> {
    let (username, password) = match creds.as_deref().map(|c| c.split_once(':')) {
        None => (String::new(), String::new()),
        Some(Some((u, p))) => (u.to_string(), p.to_string()),
        Some(None) => (creds.clone().unwrap_or_default(), String::new()),
    };
    let auth = (!username.is_empty() || registry_token.is_some()).then(|| cri::AuthConfig {
        username,
        password,
        registry_token: registry_token.unwrap_or_default(),
        ..Default::default()
    });
    let spec = cri::ImageSpec {
        image: image.clone(),
        ..Default::default()
    };
    let mut pulling = images_client(ch);
    let call = pulling.pull_image(cri::PullImageRequest {
        image: Some(spec.clone()),
        auth,
        sandbox_config: None,
    });
    tokio::pin!(call);
    // On a terminal, per-layer bars follow the daemon's pull while the call runs.
    let mut bars = std::io::IsTerminal::is_terminal(&std::io::stderr())
        .then(|| crate::progress::Bars::new(&image));
    let mut status = images_client(ch);
    let r = loop {
        tokio::select! {
            r = &mut call => break r,
            _ = tokio::time::sleep(crate::progress::POLL), if bars.is_some() => {
                let s = status
                    .image_status(cri::ImageStatusRequest { image: Some(spec.clone()), verbose: true })
                    .await;
                let progress = s.ok().and_then(|s| {
                    serde_json::from_str(s.get_ref().info.get("pullProgress")?).ok()
                });
                if let (Some(b), Some(p)) = (bars.as_mut(), progress) {
                    b.update(&p);
                }
            }
        }
    };
    if let Some(b) = bars {
        b.finish(r.is_ok());
    }
    let r = r.map_err(|s| grpc_err("PullImage", s))?.into_inner();
    println!("Image is up to date for {}", r.image_ref);
    Ok(())
}
