//! The exit file: the monitor records the container's exit in it (atomically, once the CRI
//! log is complete) and the daemon's exit watcher reads it.
//!
//! One JSON line: `{"exit_code":N,"signal":S|null,"exited_at":"RFC3339Nano"}`, where a
//! container killed by signal S has exit_code 128+S, plus `"oom_kills"` and `"oom_at_limit"`
//! when the kernel's OOM killer acted in its cgroup.

use serde::{Deserialize, Serialize};

/// The exit file's name in the container's dir.
pub const EXIT_FILE: &str = "exit";

/// The exit file's content.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExitInfo {
    pub exit_code: i32,
    /// The signal that killed the container, if one did.
    #[serde(default)]
    pub signal: Option<i32>,
    /// When it exited, RFC 3339 with nanoseconds in UTC.
    #[serde(default)]
    pub exited_at: String,
    /// `memory.events` `oom_kill` of its cgroup (v2) while it ran: processes the OOM killer
    /// killed. Omitted when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub oom_kills: u64,
    /// `memory.events` `oom` of its cgroup: times the container's own memory limit was hit
    /// (0 with kills: the limit of a cgroup above it). Omitted when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub oom_at_limit: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ExitInfo {
    /// The exit file's bytes.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).expect("plain fields serialise");
        line.push(b'\n');
        line
    }

    /// Reads an exit file's bytes.
    pub fn parse(data: &[u8]) -> Option<ExitInfo> {
        serde_json::from_slice(data).ok()
    }

    /// When the container exited (reaped, before its output was drained), in nanoseconds
    /// since the epoch; `None` if `exited_at` is missing or malformed.
    pub fn exited_at_nanos(&self) -> Option<i64> {
        crate::time::parse_rfc3339_nano(&self.exited_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_format() {
        let e = ExitInfo {
            exit_code: 137,
            signal: Some(9),
            exited_at: "2024-02-29T23:59:59.999999999Z".into(),
            ..Default::default()
        };
        assert_eq!(
            e.to_line(),
            b"{\"exit_code\":137,\"signal\":9,\"exited_at\":\"2024-02-29T23:59:59.999999999Z\"}\n"
        );
        assert_eq!(ExitInfo::parse(&e.to_line()), Some(e));
        let e = ExitInfo {
            exit_code: 0,
            signal: None,
            exited_at: "1970-01-01T00:00:00.000000000Z".into(),
            ..Default::default()
        };
        assert_eq!(
            e.to_line(),
            b"{\"exit_code\":0,\"signal\":null,\"exited_at\":\"1970-01-01T00:00:00.000000000Z\"}\n"
        );
        assert_eq!(ExitInfo::parse(&e.to_line()), Some(e));
        let e = ExitInfo {
            exit_code: 137,
            signal: Some(9),
            exited_at: "1970-01-01T00:00:00.000000000Z".into(),
            oom_kills: 2,
            oom_at_limit: 1,
        };
        assert_eq!(
            e.to_line(),
            b"{\"exit_code\":137,\"signal\":9,\"exited_at\":\"1970-01-01T00:00:00.000000000Z\",\"oom_kills\":2,\"oom_at_limit\":1}\n"
        );
        assert_eq!(ExitInfo::parse(&e.to_line()), Some(e));
    }

    #[test]
    fn optional_fields_and_garbage() {
        assert_eq!(
            ExitInfo::parse(b"{\"exit_code\":3}"),
            Some(ExitInfo {
                exit_code: 3,
                signal: None,
                exited_at: String::new(),
                ..Default::default()
            })
        );
        assert_eq!(ExitInfo::parse(b"{\"exit_code\":"), None);
        assert_eq!(ExitInfo::parse(b""), None);
    }
}
