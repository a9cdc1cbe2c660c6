//! Generates the CRI v1 bindings (messages, the two services' servers and clients) from the
//! project's own schema file, `proto/runtime/v1/api.proto`, and sandboxd's admin API
//! (`proto/sandboxd/v1/admin.proto`).
fn main() {
    println!("cargo:rerun-if-changed=proto/runtime/v1/api.proto");
    tonic_prost_build::configure()
        // sandboxctl prints answers as JSON, as crictl does.
        .type_attribute(".", "#[derive(serde::Serialize)]")
        .compile_protos(&["proto/runtime/v1/api.proto"], &["proto"])
        .expect("compile proto/runtime/v1/api.proto (needs protoc: scripts/setup installs it)");
    println!("cargo:rerun-if-changed=proto/sandboxd/v1/admin.proto");
    tonic_prost_build::configure()
        .type_attribute(".", "#[derive(serde::Serialize)]")
        .compile_protos(&["proto/sandboxd/v1/admin.proto"], &["proto"])
        .expect("compile proto/sandboxd/v1/admin.proto");
}
