//! The streaming tests' set-up (tests/streaming*.rs): a runtime with the test image, a
//! streaming server on it and a running container, and the WebSocket client's helpers.

use std::sync::Arc;

use sandboxd::streaming::{StreamingConfig, StreamingServer, Target};
use sandboxd::{ContainerConfig, Runtime};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, Message};

use super::{busybox, Env};

pub const IMAGE: &str = "sandboxd.test/busybox:stream";

pub struct Setup {
    pub env: Env,
    pub rt: Arc<Runtime>,
    pub tokio: tokio::runtime::Runtime,
    pub server: Arc<StreamingServer>,
    pub sandbox: String,
    pub container: String,
}

/// A runtime with the test image, a tokio runtime and a streaming server on it.
pub fn server(
    env: &Env,
    cfg: StreamingConfig,
) -> (Arc<Runtime>, tokio::runtime::Runtime, Arc<StreamingServer>) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("sandboxd=debug")
        .with_test_writer()
        .try_init();
    let rt = Arc::new(env.runtime());
    rt.images()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = tokio
        .block_on(StreamingServer::start(rt.clone(), cfg))
        .unwrap();
    (rt, tokio, server)
}

pub fn setup(name: &str, script: &str, ttl: u64) -> Setup {
    let env = Env::new(name);
    let cfg = StreamingConfig {
        token_ttl_secs: ttl,
        ..Default::default()
    };
    let (rt, tokio, server) = server(&env, cfg);
    let sandbox = rt.run_pod_sandbox(&env.pod(name, false)).unwrap();
    let c = ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "main".into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    };
    let container = rt.create_container(&sandbox, &c).unwrap();
    rt.start_container(&container).unwrap();
    Setup {
        env,
        rt,
        tokio,
        server,
        sandbox,
        container,
    }
}

impl Setup {
    pub fn exec_url(&self, cmd: &str, tty: bool, stdin: bool, stderr: bool) -> String {
        self.server
            .exec_url(Target::Exec {
                container_id: self.container.clone(),
                cmd: vec!["sh".into(), "-c".into(), cmd.into()],
                tty,
                stdin,
                stdout: true,
                stderr,
            })
            .unwrap()
    }

    pub fn finish(self) {
        self.rt.remove_pod_sandbox(&self.sandbox).unwrap();
        self.env.assert_no_leaks();
        drop(self.tokio);
    }
}

pub fn status(json: &str) -> serde_json::Value {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("error stream {json:?}: {e}"))
}

pub fn ws_connect(
    url: &str,
    protocol: &str,
) -> tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>> {
    let mut req = url
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
    let (ws, resp) = tungstenite::connect(req).unwrap();
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").unwrap(),
        protocol
    );
    ws
}

/// Reads channel messages until the server closes; returns per-channel bytes.
pub fn ws_collect(
    ws: &mut tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    b64: bool,
) -> std::collections::HashMap<u8, Vec<u8>> {
    use base64::Engine;
    let mut out: std::collections::HashMap<u8, Vec<u8>> = Default::default();
    loop {
        match ws.read() {
            Ok(Message::Binary(b)) if !b64 => {
                out.entry(b[0]).or_default().extend_from_slice(&b[1..])
            }
            Ok(Message::Text(t)) if b64 => {
                let t = t.as_bytes();
                let data = base64::engine::general_purpose::STANDARD
                    .decode(&t[1..])
                    .unwrap();
                out.entry(t[0] - b'0').or_default().extend_from_slice(&data);
            }
            Ok(Message::Close(_)) | Err(_) => return out,
            Ok(_) => {}
        }
    }
}
