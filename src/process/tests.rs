//! Running helpers: output, stdin, limits, caps, budgets, process groups.

use std::process::Command;
use std::time::{Duration, Instant};

use super::*;

#[test]
fn captures_output_and_stdin() {
    let mut c = Command::new("sh");
    c.args(["-c", "cat; echo err >&2; exit 3"]);
    let out = run(c, b"hello", Duration::from_secs(5)).unwrap();
    assert_eq!(out.stdout, b"hello");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn big_stdin_and_output_do_not_deadlock() {
    // The child echoes 4 MiB back while we are still writing it: both directions must
    // move at once.
    let input = vec![b'x'; 4 << 20];
    let mut c = Command::new("cat");
    c.arg("-");
    let out = run(c, &input, Duration::from_secs(20)).unwrap();
    assert_eq!(out.stdout.len(), input.len());
}

/// A scratch directory removed even when the test fails.
struct TestDir(std::path::PathBuf);

impl TestDir {
    fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn kills_the_whole_group_past_the_limit() {
    let dir = TestDir::new("sandboxd-proc");
    let pidf = dir.0.join("grandchild");
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!("sleep 30 & echo $! > {}; wait", pidf.display()));
    let t = Instant::now();
    let e = run(c, b"", Duration::from_millis(300)).unwrap_err();
    assert!(matches!(e, RunError::Timeout { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
    let gc = read_pid(&pidf).expect("grandchild pid");
    assert!(wait_gone(&[gc], Duration::from_secs(2)).is_empty() || !alive(gc));
}

#[test]
fn output_is_capped_and_a_lingering_grandchild_does_not_hold_us() {
    let dir = TestDir::new("sandboxd-proc2");
    let pidf = dir.0.join("lingering");
    let mut c = Command::new("sh");
    // 8 MiB of output, then exit while a background child keeps stdout open for 29 s.
    c.arg("-c").arg(format!(
        "head -c 8388608 /dev/zero; sleep 29 & echo $! > {}; exit 0",
        pidf.display()
    ));
    let limits = Limits {
        timeout: Some(Duration::from_secs(20)),
        stdout_cap: 1 << 20,
        stderr_cap: 1024,
        drain: Duration::from_millis(200),
        cancel: None,
        budget: None,
        within: None,
    };
    let t = Instant::now();
    let out = run_with(c, b"", &limits, |_| {}).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(out.stdout.len(), 1 << 20);
    assert_eq!(out.stdout_dropped, 7 << 20);
    if let Some(p) = read_pid(&pidf) {
        kill_tree(p);
    }
}

#[test]
fn a_shared_budget_bounds_concurrent_calls() {
    let budget = OutputBudget::new(3 << 20);
    let limits = Limits {
        timeout: Some(Duration::from_secs(20)),
        stdout_cap: 2 << 20,
        stderr_cap: 1024,
        drain: Duration::from_millis(200),
        cancel: None,
        budget: Some(budget.clone()),
        within: None,
    };
    let outs: Vec<Output> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let l = limits.clone();
                s.spawn(move || {
                    let mut c = Command::new("sh");
                    c.args(["-c", "head -c 8388608 /dev/zero; sleep 0.5"]);
                    run_with(c, b"", &l, |_| {}).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let kept: usize = outs.iter().map(|o| o.stdout.len()).sum();
    assert!(kept <= 3 << 20, "{kept} bytes kept over a 3 MiB budget");
    assert!(outs.iter().all(|o| o.stdout.len() <= 2 << 20));
    assert_eq!(budget.left(), 3 << 20, "the budget was not given back");
}

#[test]
fn missing_program() {
    let c = Command::new("/nonexistent/prog");
    let e = run(c, b"", Duration::from_secs(1)).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/prog"), "{e}");
}

/// A recorded pid names its process only while start time and boot match: another start time
/// (a later process given the pid), another boot, or (records without either) a record made
/// before this boot is a dead process.
#[test]
fn a_recorded_pid_is_its_process_only_while_start_time_and_boot_match() {
    let me = ProcId::now(std::process::id() as i32);
    assert!(me.start_ticks > 0 && !me.boot_id.is_empty());
    assert!(me.alive());
    assert!(!ProcId {
        start_ticks: me.start_ticks + 1,
        ..me.clone()
    }
    .alive());
    assert!(!ProcId {
        boot_id: "another-boot".into(),
        ..me.clone()
    }
    .alive());
    let legacy = ProcId {
        start_ticks: 0,
        boot_id: String::new(),
        ..me.clone()
    };
    assert!(ProcId {
        recorded_at: crate::state::now_nanos(),
        ..legacy.clone()
    }
    .alive());
    assert!(!ProcId {
        recorded_at: 1,
        ..legacy
    }
    .alive());
    // A pid file: written after the process started (ours) or before this boot.
    let f = std::env::temp_dir().join(format!("sandboxd-pidfile-{}", std::process::id()));
    std::fs::write(&f, me.pid.to_string()).unwrap();
    assert!(alive_as_written(me.pid, &f));
    let old = std::fs::File::options().write(true).open(&f).unwrap();
    old.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1))
        .unwrap();
    assert!(!alive_as_written(me.pid, &f));
    std::fs::remove_file(&f).unwrap();
}
