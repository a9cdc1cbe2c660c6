//! Generates the NRI protocol's messages, the plugin service's client and the runtime
//! service's server (and the reverse, for test plugins) from `proto/nri/v1alpha1/api.proto`.
use ttrpc_codegen_prost::{Codegen, Customize};

fn main() {
    println!("cargo:rerun-if-changed=../proto/nri/v1alpha1/api.proto");
    Codegen::new()
        .out_dir(std::env::var("OUT_DIR").expect("OUT_DIR"))
        .inputs(["../proto/nri/v1alpha1/api.proto"])
        .include("../proto")
        .prost()
        .customize(Customize {
            async_all: true,
            ..Default::default()
        })
        .run()
        .expect("compile proto/nri/v1alpha1/api.proto (needs protoc: scripts/setup installs it)");
}
