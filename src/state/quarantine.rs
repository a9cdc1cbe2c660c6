//! Records that could not be read at start-up. Such a record is left where it is and nothing
//! it may name is collected (its namespace files, its CNI attachment, its runtime
//! containers): an explicit RemovePodSandbox / RemoveContainer of its id finishes the
//! teardown from what can be known without it (the id names its files; the CNI attachment is
//! kept on its own).

use std::collections::BTreeMap;

/// What is quarantined, by full id.
#[derive(Debug, Default, Clone)]
pub struct Quarantine {
    pub sandboxes: BTreeMap<String, String>,
    pub containers: BTreeMap<String, String>,
}

impl Quarantine {
    /// The one quarantined id of `map` that `prefix` names, if any (an ambiguous prefix names
    /// none: the caller's lookup reports ambiguity among live objects first).
    pub fn find(map: &BTreeMap<String, String>, prefix: &str) -> Option<String> {
        let mut it = map
            .range(prefix.to_string()..)
            .take_while(|(id, _)| id.starts_with(prefix));
        let first = it.next().map(|(id, _)| id.clone());
        if it.next().is_some() {
            return None;
        }
        first
    }

    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty() && self.containers.is_empty()
    }

    /// One line per quarantined record, for `Status` and logs.
    pub fn describe(&self) -> Vec<String> {
        self.sandboxes
            .iter()
            .map(|(id, why)| format!("sandbox {id}: {why}"))
            .chain(
                self.containers
                    .iter()
                    .map(|(id, why)| format!("container {id}: {why}")),
            )
            .collect()
    }
}
