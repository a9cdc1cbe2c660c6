//! VM runtimes with an OCI CLI (Kata-style, without a shim): the pod's sandbox process is the
//! VM (its monitor process), started in the pre-created netns handed over by path, whose
//! interfaces it takes over; containers run on the guest's kernel.

use super::Family;

#[derive(Debug)]
pub struct Vm;

impl Family for Vm {
    fn name(&self) -> &'static str {
        "vm"
    }

    fn sandbox_process(&self) -> bool {
        true
    }

    fn node_kernel(&self) -> bool {
        false
    }
}
