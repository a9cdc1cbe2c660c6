//! The CRI contract for images and checkpoints, through the daemon's gRPC socket: pulls
//! with client deadlines and shared layers, RemoveImage of every tag, CheckpointContainer.
mod common;

use std::time::Duration;

use common::cri::*;
use common::*;
use sandboxd::api::v1 as cri;
use tonic::Code;

/// Pulls: a client deadline answers DeadlineExceeded; an image whose layers are unpacked
/// already (another tag, an earlier pull of a removed image, concurrent pulls) reuses them;
/// RemoveImage of one tag removes the image with all its tags.
#[test]
fn pulls_deadlines_and_shared_layers() {
    use common::fake_registry::{Answer, FakeRegistry};
    use sandboxd::api::v1::image_service_client::ImageServiceClient;
    let env = Env::new("conf-pull");
    let reg = common::registry::Registry::start(&env.base.join("registry"), None);
    reg.push_busybox("a/busybox", "1", None);
    reg.push_busybox("a/busybox", "2", None);
    reg.push_busybox("b/other", "1", None);
    let (d, rt, _c) = daemon(&env);
    let mut images = rt.block_on(async {
        ImageServiceClient::new(
            common::daemon::connect(&d.socket.to_string_lossy(), Duration::from_secs(30))
                .await
                .unwrap(),
        )
    });
    let pull = |images: &mut ImageServiceClient<tonic::transport::Channel>, name: &str| {
        rt.block_on(images.pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: name.into(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        }))
        .map(|r| r.into_inner().image_ref)
    };
    let t1 = format!("{}/a/busybox:1", reg.addr);
    let t2 = format!("{}/a/busybox:2", reg.addr);
    let other = format!("{}/b/other:1", reg.addr);
    let id = pull(&mut images, &t1).unwrap();
    assert_eq!(pull(&mut images, &t2).unwrap(), id);
    // Removing one tag removes the image (both tags).
    rt.block_on(images.remove_image(cri::RemoveImageRequest {
        image: Some(cri::ImageSpec {
            image: t1.clone(),
            ..Default::default()
        }),
    }))
    .unwrap();
    let listed = rt
        .block_on(images.list_images(cri::ListImagesRequest { filter: None }))
        .unwrap()
        .into_inner()
        .images;
    assert!(listed.iter().all(|i| i.id != id), "{listed:?}");
    // Pulled again, and concurrently under two names: the layers are reused.
    let (mut a, mut b) = (images.clone(), images.clone());
    let (ta, tb) = (t1.clone(), other.clone());
    let (ra, rb) = rt.block_on(async move {
        let fa = a.pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: ta,
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        });
        let fb = b.pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: tb,
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        });
        tokio::join!(fa, fb)
    });
    assert_eq!(ra.unwrap().into_inner().image_ref, id);
    assert_eq!(rb.unwrap().into_inner().image_ref, id);
    // A registry that never answers in time: the client's deadline is DeadlineExceeded.
    let slow = FakeRegistry::start(|_| {
        std::thread::sleep(Duration::from_secs(5));
        None::<Answer>
    });
    let mut req = tonic::Request::new(cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: format!("{}/x/slow:1", slow.addr),
            ..Default::default()
        }),
        auth: None,
        sandbox_config: None,
    });
    req.set_timeout(Duration::from_millis(800));
    let e = rt.block_on(images.pull_image(req)).unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    drop(d);
    env.assert_no_leaks();
}

/// CheckpointContainer: where `criu check` fails on this host, `Unimplemented` with CRIU's
/// own reason and no archive; where it works, an archive laid out as CRI-O's (CRIU images,
/// config.dump, spec.dump, rootfs-diff.tar) while the container keeps running.
#[test]
fn checkpoint_with_criu_or_its_reason() {
    let env = Env::new("conf-ckpt");
    let (_d, rt, mut c) = daemon(&env);
    let p = pod("ckpt", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let id = sleeper(&rt, &mut c, &sb, &p, "c");
    exec(&rt, &mut c, &id, "echo kept > /written");
    let location = env.base.join("ckpt.tar");
    let r = rt.block_on(c.checkpoint_container(cri::CheckpointContainerRequest {
        container_id: id.clone(),
        location: location.to_string_lossy().into_owned(),
        timeout: 60,
    }));
    let installed = sh_ok("command -v criu").0;
    let (works, said) = sh_ok("criu check 2>&1");
    if installed && works {
        r.unwrap();
        let listing = sh(&format!("tar -tf {}", location.display()));
        for want in [
            "./checkpoint/",
            "./config.dump",
            "./spec.dump",
            "./rootfs-diff.tar",
        ] {
            assert!(
                listing.lines().any(|l| l == want),
                "{want} not in\n{listing}"
            );
        }
        let s = rt
            .block_on(c.container_status(cri::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            }))
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        assert_eq!(s.state, cri::ContainerState::ContainerRunning as i32);
    } else {
        let e = r.unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
        let reason = if installed {
            said.lines()
                .find(|l| l.starts_with("Error"))
                .unwrap_or_else(|| said.lines().next().unwrap())
                .trim()
                .to_string()
        } else {
            "criu is not installed".to_string()
        };
        assert!(
            e.message().contains(&reason),
            "{:?} lacks {reason:?}",
            e.message()
        );
        assert!(!location.exists());
    }
    remove_pod(&rt, &mut c, &sb);
}
