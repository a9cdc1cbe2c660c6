//! A registry that misbehaves on purpose (fault injection for the pull's bounds): a plain
//! HTTP/1.1 server on 127.0.0.1 that answers each path with what the test says, including
//! lies a real registry would not tell (a body longer than its descriptor, a huge manifest),
//! and slow links (a body paced out in chunks).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;

/// One answer: status, content type, body, and whether to send a Content-Length.
#[derive(Clone)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: Arc<Vec<u8>>,
    pub content_length: bool,
    /// Sends the body this many bytes at a time with this pause between (a slow link).
    pub pace: Option<(usize, std::time::Duration)>,
    /// More header lines (`Name: value`).
    pub headers: Vec<String>,
}

impl Answer {
    pub fn json(body: Vec<u8>, content_type: &str) -> Answer {
        Answer {
            status: 200,
            content_type: content_type.into(),
            body: Arc::new(body),
            content_length: true,
            pace: None,
            headers: Vec::new(),
        }
    }
}

pub struct FakeRegistry {
    pub addr: String,
}

impl FakeRegistry {
    /// Serves `route(path)` (None = 404) until the test process ends.
    pub fn start(route: impl Fn(&str) -> Option<Answer> + Send + Sync + 'static) -> FakeRegistry {
        Self::start_with_range(move |p, _| route(p))
    }

    /// [`FakeRegistry::start`] with the request's `Range: bytes=S-E` handed to `route`.
    pub fn start_with_range(
        route: impl Fn(&str, Option<(usize, usize)>) -> Option<Answer> + Send + Sync + 'static,
    ) -> FakeRegistry {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let route = Arc::new(route);
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let route = route.clone();
                std::thread::spawn(move || {
                    let mut r = BufReader::new(conn.try_clone().unwrap());
                    let mut line = String::new();
                    if r.read_line(&mut line).is_err() {
                        return;
                    }
                    let path = line.split(' ').nth(1).unwrap_or("").to_string();
                    let mut range = None;
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                        let lower = h.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("range: bytes=") {
                            let (a, b) = v.trim().split_once('-').unwrap_or(("", ""));
                            range = a.parse().ok().zip(b.parse().ok());
                        }
                    }
                    let mut w = conn;
                    match route(&path, range) {
                        Some(a) => {
                            let mut head = format!(
                                "HTTP/1.1 {} X\r\nContent-Type: {}\r\nConnection: close\r\n",
                                a.status, a.content_type
                            );
                            if a.content_length {
                                head += &format!("Content-Length: {}\r\n", a.body.len());
                            }
                            for h in &a.headers {
                                head += &format!("{h}\r\n");
                            }
                            head += "\r\n";
                            let _ = w.write_all(head.as_bytes());
                            match a.pace {
                                None => {
                                    let _ = w.write_all(&a.body);
                                }
                                Some((n, pause)) => {
                                    for c in a.body.chunks(n.max(1)) {
                                        if w.write_all(c).and_then(|_| w.flush()).is_err() {
                                            break;
                                        }
                                        std::thread::sleep(pause);
                                    }
                                }
                            }
                        }
                        None => {
                            let _ = w.write_all(
                                b"HTTP/1.1 404 X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                            );
                        }
                    }
                });
            }
        });
        FakeRegistry { addr }
    }
}

/// An image of one layer as a registry serves it: its manifest, config and layer.
pub struct OneLayer {
    manifest: Vec<u8>,
    config: Vec<u8>,
    layer: Vec<u8>,
    config_digest: String,
    layer_digest: String,
}

impl OneLayer {
    /// `layer_type`: the layer's media type (`application/vnd.oci.image.layer.v1.tar+gzip`…).
    pub fn new(config: Vec<u8>, layer: Vec<u8>, layer_type: &str) -> OneLayer {
        let (config_digest, layer_digest) =
            (super::busybox::sha(&config), super::busybox::sha(&layer));
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
            "layers": [{"mediaType": layer_type, "digest": layer_digest, "size": layer.len()}],
        }))
        .unwrap();
        OneLayer {
            manifest,
            config,
            layer,
            config_digest,
            layer_digest,
        }
    }

    /// The answer to `path` (`…/manifests/<tag>`, `…/blobs/<digest>`; None: 404), the layer
    /// sent as `pace` says.
    pub fn answer(&self, path: &str, pace: Option<(usize, std::time::Duration)>) -> Option<Answer> {
        if path.contains("/manifests/") {
            Some(Answer::json(
                self.manifest.clone(),
                "application/vnd.oci.image.manifest.v1+json",
            ))
        } else if path.ends_with(&format!("/blobs/{}", self.config_digest)) {
            Some(Answer::json(
                self.config.clone(),
                "application/octet-stream",
            ))
        } else if path.ends_with(&format!("/blobs/{}", self.layer_digest)) {
            let mut a = Answer::json(self.layer.clone(), "application/octet-stream");
            a.pace = pace;
            Some(a)
        } else {
            None
        }
    }
}
