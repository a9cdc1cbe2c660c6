//! The sandboxctl binary as the tests run it against a daemon's socket.

use std::process::Command;

/// `sandboxctl -r EP ARGS…`.
pub fn sandboxctl(ep: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sandboxctl"));
    c.arg("-r").arg(ep).args(args);
    c
}

/// Runs sandboxctl, asserts it succeeded and returns its stdout.
pub fn sandboxctl_ok(ep: &str, args: &[&str]) -> String {
    let out = sandboxctl(ep, args).output().unwrap();
    assert!(
        out.status.success(),
        "sandboxctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
