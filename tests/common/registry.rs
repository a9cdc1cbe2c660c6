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
    tls: bool,
}

impl Registry {
    /// Starts a registry storing under `dir`; with `user` = `(name, password)` it requires them;
    /// with `tls` it serves HTTPS with a self-signed certificate for 127.0.0.1 (`dir/ca.pem`).
    pub fn start(dir: &Path, user: Option<(&str, &str)>) -> Registry {
        Self::start_with(dir, user, false)
    }

    pub fn start_with(dir: &Path, user: Option<(&str, &str)>, tls: bool) -> Registry {
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
        if tls {
            make_tls_files(dir);
            cfg += &format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.join("cert.pem").display(),
                dir.join("key.pem").display()
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
        Registry {
            child,
            addr,
            log,
            tls,
        }
    }

    /// Pushes the busybox test image as `<addr>/<repo>:<tag>`; returns the layer digest.
    pub fn push_busybox(&self, repo: &str, tag: &str, user: Option<(&str, &str)>) -> String {
        let (layer, config) = super::busybox::gzip_layer_and_config();
        let digest = super::busybox::sha(&layer);
        let client = oci_client::Client::new(oci_client::client::ClientConfig {
            protocol: if self.tls {
                oci_client::client::ClientProtocol::Https
            } else {
                oci_client::client::ClientProtocol::Http
            },
            accept_invalid_certificates: self.tls, // the test's own self-signed registry
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

/// Writes a CA (`ca.pem`) and a server certificate for 127.0.0.1 signed by it (`cert.pem`,
/// `key.pem`) into `dir`, with openssl.
pub fn make_tls_files(dir: &Path) {
    let ssl = |args: &str| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("cd {} && openssl {args}", dir.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::create_dir_all(dir).unwrap();
    ssl("req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=sandboxd-test-ca -keyout ca-key.pem -out ca.pem");
    ssl("req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout key.pem -out server.csr");
    std::fs::write(
        dir.join("ext.cnf"),
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    ssl("x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 -extfile ext.cnf -out cert.pem");
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
