//! A private registry (Debian's `docker-registry`) on a free 127.0.0.1 port, optionally behind
//! htpasswd basic auth, started and stopped by the test; and a push of the busybox image.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`
    pub addr: String,
    pub log: PathBuf,
}

impl Registry {
    /// Starts a registry storing under `dir`; with `user` = `(name, password)` it requires them.
    pub fn start(dir: &Path, user: Option<(&str, &str)>) -> Registry {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut cfg = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            dir.join("data").display()
        );
        if let Some((name, password)) = user {
            let hash = bcrypt::hash(password, 4).unwrap();
            std::fs::write(dir.join("htpasswd"), format!("{name}:{hash}\n")).unwrap();
            cfg += &format!(
                "auth:\n  htpasswd:\n    realm: sandboxd-test\n    path: {}\n",
                dir.join("htpasswd").display()
            );
        }
        std::fs::write(dir.join("config.yml"), cfg).unwrap();
        let log = dir.join("registry.log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
            ))
            .spawn()
            .expect("docker-registry installed (scripts/setup)");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "registry did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Registry { child, addr, log }
    }

    /// Pushes the busybox test image as `<addr>/<repo>:<tag>`; returns the layer digest.
    pub fn push_busybox(&self, repo: &str, tag: &str, user: Option<(&str, &str)>) -> String {
        let (layer, config) = super::busybox::gzip_layer_and_config();
        let digest = super::busybox::sha(&layer);
        let client = oci_client::Client::new(oci_client::client::ClientConfig {
            protocol: oci_client::client::ClientProtocol::Http,
            ..Default::default()
        });
        let r = oci_client::Reference::with_tag(self.addr.clone(), repo.into(), tag.into());
        let auth = match user {
            Some((u, p)) => oci_client::secrets::RegistryAuth::Basic(u.into(), p.into()),
            None => oci_client::secrets::RegistryAuth::Anonymous,
        };
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(client.push(
                &r,
                &[oci_client::client::ImageLayer::oci_v1_gzip(layer, None)],
                oci_client::client::Config::oci_v1(config, None),
                &auth,
                None,
            ))
            .unwrap();
        digest
    }

    /// How many times the registry served `GET .../blobs/<digest>`.
    pub fn blob_gets(&self, digest: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains(&format!("/blobs/{digest} ")))
            .filter(|l| l.contains("\" 200 "))
            .count()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
