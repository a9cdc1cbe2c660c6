//! runc and the runtimes with its CLI and behaviour (youki, and any unnamed binary): the
//! defaults of [`Family`].

use super::Family;

#[derive(Debug)]
pub struct Runc;

impl Family for Runc {
    fn name(&self) -> &'static str {
        "runc"
    }

    fn claims_binary(&self, file_name: &str) -> bool {
        file_name == "runc"
    }
}
