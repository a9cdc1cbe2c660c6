//! A node without a CA bundle (the VM lane's guest has no ca-certificates): pulls over plain
//! HTTP (a loopback mirror) work all the same, a TLS registry with a CA configured for it
//! works on that CA alone, and one without says what is missing. Alone in its binary: it
//! points the TLS stack's trust store at an empty file for the whole process.

mod common;

use common::registry::Registry;
use common::*;
use sandboxd::image::{Auth, RegistryConfig};

#[test]
fn pulls_work_on_a_node_without_a_ca_bundle() {
    let env = Env::new("reg-noca");
    let empty = env.base.join("no-ca");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("none.pem"), b"").unwrap();
    // The registries are filled first (the test's own client needs the trust store).
    let plain = Registry::start(&env.base.join("plain"), None);
    plain.push_busybox("noca/busybox", "1", None);
    let name = format!("{}/noca/busybox:1", plain.addr);
    let dir = env.base.join("tls");
    let tls = Registry::start_with(&dir, None, true);
    tls.push_busybox("noca/tls", "1", None);
    let tls_name = format!("{}/noca/tls:1", tls.addr);
    // SAFETY: the only test of this binary; the registries' helper threads do not read the
    // environment.
    unsafe {
        std::env::set_var("SSL_CERT_FILE", empty.join("none.pem"));
        std::env::set_var("SSL_CERT_DIR", &empty);
    }
    let rt = env.runtime();
    rt.pull_image(&name, &Auth::default())
        .expect("a plain-HTTP pull needs no CA bundle");

    let e = rt
        .pull_image(&tls_name, &Auth::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("CA certificates could not be loaded") && e.contains("ca-certificates"),
        "{e}"
    );
    drop(rt);
    let mut cfg = env.cfg.clone();
    cfg.registries.insert(
        tls.addr.clone(),
        RegistryConfig {
            ca_file: Some(dir.join("ca.pem")),
            ..Default::default()
        },
    );
    let rt = sandboxd::Runtime::new(cfg).unwrap();
    rt.pull_image(&tls_name, &Auth::default())
        .expect("a configured CA is enough on its own");
    env.assert_no_leaks();
}
