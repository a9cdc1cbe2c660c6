//! Slots for ExecSync calls: how many run at once, per container and on the node.

use crate::error::{Error, Result};

/// ExecSync calls running, per container and in all.
#[derive(Default)]
pub(crate) struct ExecSlots {
    running: std::sync::Mutex<(usize, std::collections::HashMap<String, usize>)>,
}

/// One running ExecSync; its slot is given back when dropped.
pub(crate) struct ExecSlot<'a> {
    slots: &'a ExecSlots,
    id: String,
}

impl ExecSlots {
    /// A slot for one more ExecSync in container `id`, or ResourceExhausted saying which
    /// limit is reached.
    pub(crate) fn take(&self, id: &str, per_container: usize, all: usize) -> Result<ExecSlot<'_>> {
        let mut g = crate::state::lock(&self.running);
        let (total, per) = &mut *g;
        let mine = per.get(id).copied().unwrap_or(0);
        if mine >= per_container {
            return Err(Error::ResourceExhausted(format!(
                "container {id} already runs {mine} ExecSync calls (exec_sync_max_per_container)"
            )));
        }
        if *total >= all {
            return Err(Error::ResourceExhausted(format!(
                "the node already runs {total} ExecSync calls (exec_sync_max)"
            )));
        }
        *total += 1;
        *per.entry(id.to_string()).or_default() += 1;
        Ok(ExecSlot {
            slots: self,
            id: id.to_string(),
        })
    }
}

impl Drop for ExecSlot<'_> {
    fn drop(&mut self) {
        let mut g = crate::state::lock(&self.slots.running);
        let (total, per) = &mut *g;
        *total -= 1;
        if let Some(n) = per.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.id);
            }
        }
    }
}
