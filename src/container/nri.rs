//! The runtime as NRI plugins reach it: every pod and container for a joining plugin, and
//! the updates and evictions plugins ask for. It holds the runtime weakly, so plugins never
//! keep it alive.

use std::collections::HashMap;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use sandboxd_nri_api::api;

use crate::nri::{convert, Updates};
use crate::runtime::Runtime;
use crate::state::lock;

/// The runtime, for the plugins' side.
pub struct Domain {
    rt: Weak<Runtime>,
    /// What each plugin's updates and evictions may still log in the current window.
    logs: Mutex<HashMap<String, LogWindow>>,
}

impl Domain {
    pub(crate) fn new(rt: Weak<Runtime>) -> Domain {
        Domain {
            rt,
            logs: Mutex::new(HashMap::new()),
        }
    }

    /// Whether one more line about `plugin`'s updates may be logged: at most
    /// [`LOG_LINES`] per [`LOG_WINDOW`] and plugin (a plugin's requests cannot fill the
    /// node's log); what was held back is counted in one line when the next window opens.
    fn may_log(&self, plugin: &str) -> bool {
        let mut logs = lock(&self.logs);
        if logs.len() > 256 && !logs.contains_key(plugin) {
            logs.clear();
        }
        let w = logs.entry(plugin.to_string()).or_insert_with(|| LogWindow {
            since: Instant::now(),
            lines: 0,
            held: 0,
        });
        if w.since.elapsed() >= LOG_WINDOW {
            if w.held > 0 {
                tracing::warn!(
                    plugin,
                    held_back = w.held,
                    "NRI plugin's updates and evictions: lines held back in the last window"
                );
            }
            *w = LogWindow {
                since: Instant::now(),
                lines: 0,
                held: 0,
            };
        }
        if w.lines < LOG_LINES {
            w.lines += 1;
            true
        } else {
            w.held += 1;
            false
        }
    }
}

/// Lines a plugin's updates and evictions may log per window.
const LOG_LINES: u32 = 20;
const LOG_WINDOW: Duration = Duration::from_secs(10);

struct LogWindow {
    since: Instant,
    lines: u32,
    held: u64,
}

impl Updates for Domain {
    fn apply(
        &self,
        plugin: &str,
        update: &[api::ContainerUpdate],
        evict: &[api::ContainerEviction],
        gone: &dyn Fn() -> bool,
    ) -> Vec<api::ContainerUpdate> {
        let Some(rt) = self.rt.upgrade() else {
            return update.to_vec();
        };
        let mut failed = Vec::new();
        for (i, u) in update.iter().enumerate() {
            if gone() {
                tracing::warn!(
                    plugin,
                    dropped = update.len() - i + evict.len(),
                    "NRI plugin gone: the rest of its updates dropped"
                );
                return failed;
            }
            let r = rt.container_record(&u.container_id).and_then(|rec| {
                let Some(res) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
                    return Ok(());
                };
                let want = convert::update_resources(&rec.config.resources, res)
                    .map_err(crate::error::Error::InvalidArgument)?;
                // Checked as CreateContainer and UpdateContainerResources check them.
                super::spec::validate_resources(&want)?;
                super::update::apply_resources(&rt, &rec.id, &want)
            });
            if let Err(e) = r {
                if self.may_log(plugin) {
                    tracing::warn!(plugin, container_id = %u.container_id, error = %e, "NRI plugin's update not applied");
                }
                if !u.ignore_failure {
                    failed.push(u.clone());
                }
            }
        }
        for (i, e) in evict.iter().enumerate() {
            if gone() {
                tracing::warn!(
                    plugin,
                    dropped = evict.len() - i,
                    "NRI plugin gone: the rest of its evictions dropped"
                );
                break;
            }
            let r = super::stop::stop(&rt, &e.container_id, std::time::Duration::ZERO);
            if self.may_log(plugin) {
                match r {
                    Ok(()) => {
                        tracing::warn!(plugin, container_id = %e.container_id, reason = %e.reason, "NRI plugin evicted a container: stopped it")
                    }
                    Err(err) => {
                        tracing::warn!(plugin, container_id = %e.container_id, error = %err, "NRI plugin's eviction failed")
                    }
                }
            }
        }
        failed
    }

    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        let Some(rt) = self.rt.upgrade() else {
            return Default::default();
        };
        let (sandboxes, containers): (Vec<_>, Vec<_>) = {
            let reg = lock(&rt.registry);
            (
                reg.sandboxes.values().cloned().collect(),
                reg.containers.values().cloned().collect(),
            )
        };
        let pods = sandboxes
            .iter()
            .map(|e| convert::pod(&lock(&e.record), &rt.cfg))
            .collect();
        let ctrs = containers
            .iter()
            .map(|e| convert::created(&lock(&e.record).clone()))
            .collect();
        (pods, ctrs)
    }
}
