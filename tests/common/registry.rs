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
        let addr = super::free_loopback_addr();
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
        self.push_image(repo, tag, user, &[layer], &config);
        digest
    }

    /// Pushes an image of gzip `layers` (as pushed) and `config` as `<repo>:<tag>`; returns
    /// the manifest's digest.
    pub fn push_image(
        &self,
        repo: &str,
        tag: &str,
        user: Option<(&str, &str)>,
        layers: &[Vec<u8>],
        config: &[u8],
    ) -> String {
        let layers: Vec<_> = layers
            .iter()
            .map(|l| (l.clone(), serde_json::Value::Null))
            .collect();
        self.push_with(repo, tag, user, &layers, config)
    }

    /// Pushes an image whose layers are pushed as given with their manifest annotations
    /// (`(blob, annotations)`; eStargz and zstd:chunked layers name their TOC there); returns the
    /// manifest's digest.
    pub fn push_annotated(
        &self,
        repo: &str,
        tag: &str,
        layers: &[(Vec<u8>, serde_json::Value)],
        config: &[u8],
    ) -> String {
        self.push_with(repo, tag, None, layers, config)
    }

    /// The `layers` (gzip, or zstd where the blob starts with zstd's magic; annotations: none
    /// where null), `config` and their manifest as `<repo>:<tag>`; the manifest's digest.
    fn push_with(
        &self,
        repo: &str,
        tag: &str,
        user: Option<(&str, &str)>,
        layers: &[(Vec<u8>, serde_json::Value)],
        config: &[u8],
    ) -> String {
        let mut descs = Vec::new();
        for (l, ann) in layers {
            self.push_blob(repo, user, l);
            let media_type = match l.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
                true => "application/vnd.oci.image.layer.v1.tar+zstd",
                false => "application/vnd.oci.image.layer.v1.tar+gzip",
            };
            let mut d = serde_json::json!({"mediaType": media_type, "digest": super::busybox::sha(l), "size": l.len()});
            if !ann.is_null() {
                d["annotations"] = ann.clone();
            }
            descs.push(d);
        }
        self.push_blob(repo, user, config);
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": super::busybox::sha(config), "size": config.len()},
            "layers": descs,
        }))
        .unwrap();
        self.push_manifest(
            repo,
            tag,
            user,
            &manifest,
            "application/vnd.oci.image.manifest.v1+json",
        );
        super::busybox::sha(&manifest)
    }

    /// The registry's access-log lines for `GET …/blobs/<digest>` with their status.
    pub fn blob_requests(&self, digest: &str) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains(&format!("/blobs/{digest} ")))
            .map(str::to_string)
            .collect()
    }

    fn client(&self) -> (reqwest::Client, String) {
        sandboxd::image::registry::install_tls_provider();
        let c = reqwest::Client::builder()
            // The test's own self-signed registry.
            .tls_danger_accept_invalid_certs(self.tls)
            .no_proxy()
            .build()
            .unwrap();
        let base = format!(
            "{}://{}",
            if self.tls { "https" } else { "http" },
            self.addr
        );
        (c, base)
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// Uploads a blob (monolithic upload).
    pub fn push_blob(&self, repo: &str, user: Option<(&str, &str)>, data: &[u8]) {
        let (c, base) = self.client();
        let auth = |r: reqwest::RequestBuilder| match user {
            Some((u, p)) => r.basic_auth(u, Some(p)),
            None => r,
        };
        Self::run(async {
            let r = auth(c.post(format!("{base}/v2/{repo}/blobs/uploads/")))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 202, "start upload: {r:?}");
            let loc = r.headers()["location"].to_str().unwrap().to_string();
            let url = if loc.starts_with("http") {
                loc
            } else {
                format!("{base}{loc}")
            };
            let sep = if url.contains('?') { '&' } else { '?' };
            let r = auth(c.put(format!("{url}{sep}digest={}", super::busybox::sha(data))))
                .header("content-type", "application/octet-stream")
                .body(data.to_vec())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 201, "upload: {:?}", r.text().await);
        })
    }

    /// Puts a manifest (any bytes) under `reference`.
    pub fn push_manifest(
        &self,
        repo: &str,
        reference: &str,
        user: Option<(&str, &str)>,
        body: &[u8],
        media_type: &str,
    ) {
        let (c, base) = self.client();
        Self::run(async {
            let mut r = c
                .put(format!("{base}/v2/{repo}/manifests/{reference}"))
                .header("content-type", media_type)
                .body(body.to_vec());
            if let Some((u, p)) = user {
                r = r.basic_auth(u, Some(p));
            }
            let r = r.send().await.unwrap();
            assert_eq!(r.status().as_u16(), 201, "manifest: {:?}", r.text().await);
        })
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
