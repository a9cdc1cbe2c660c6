//! crun: runc's CLI and behaviour. What it refuses on a host (a cgroup v1 hybrid layout, for
//! Debian 12's crun 1.8) is found by the start-up probe's trial container, not assumed here.

use super::Family;

#[derive(Debug)]
pub struct Crun;

impl Family for Crun {
    fn name(&self) -> &'static str {
        "crun"
    }

    fn claims_binary(&self, file_name: &str) -> bool {
        file_name == "crun"
    }
}
