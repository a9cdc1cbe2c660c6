//! The chaos benchmark: rounds of N pods (each with a running busybox container) started by C
//! clients while the daemon is SIGKILLed K times at random moments and restarted on the same
//! root. Per round: pods, kills, pods lost, containers whose reported state differs from the
//! runtime's, names stuck, restart times, what the teardown left, host leaks. Goal: all zero.
//! Run it with `scripts/bench-chaos`, which records the table in bench/RESULTS.md.
//!
//! Usage: cargo bench --bench chaos -- [--rounds R] [--pods N] [--clients C] [--kills K]

#[path = "../tests/common/mod.rs"]
mod common;

use common::Env;

const IMAGE: &str = "sandboxd.test/busybox:chaos";

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (rounds, pods, clients, kills) = (
        arg("--rounds", 10),
        arg("--pods", 120),
        arg("--clients", 16),
        arg("--kills", 3),
    );
    println!("| round | pods | kills | lost | mismatched | stuck | orphans (audit ms) | left | host leaks | restart ms (each) | round s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut totals = (0, 0, 0, 0, 0, 0, 0);
    for r in 0..rounds {
        let mut env = Env::new("bench-chaos");
        if pods > 250 {
            // More pods than a /24 has addresses.
            env.widen_subnet(250);
        }
        sandboxd::image::ImageStore::new(env.cfg.root.join("images"))
            .unwrap()
            .import(&common::busybox::oci_layout(&env.base, IMAGE), None)
            .unwrap();
        let rep = common::chaos::round(&env, pods, clients, kills, r, IMAGE);
        let leaks =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| env.assert_no_leaks()))
                .err()
                .map(|e| {
                    e.downcast_ref::<String>()
                        .cloned()
                        .unwrap_or_else(|| "leak".into())
                });
        let restarts: Vec<String> = rep.restart_ms.iter().map(|m| format!("{m:.0}")).collect();
        println!(
            "| {r} | {} | {} | {} | {} | {} | {} ({:.1}) | {} | {} | {} | {:.1} |",
            rep.pods,
            rep.kills,
            rep.lost.len(),
            rep.mismatched.len(),
            rep.stuck.len(),
            rep.orphans.len(),
            rep.audit_ms,
            rep.left,
            if leaks.is_some() { 1 } else { 0 },
            restarts.join(", "),
            rep.seconds
        );
        for (what, v) in [
            ("lost", &rep.lost),
            ("mismatched", &rep.mismatched),
            ("stuck", &rep.stuck),
            ("orphan", &rep.orphans),
        ] {
            for x in v {
                eprintln!("round {r}: {what}: {x}");
            }
        }
        if let Some(l) = &leaks {
            eprintln!("round {r}: leaks: {l}");
        }
        totals.0 += rep.pods;
        totals.1 += rep.kills;
        totals.2 += rep.lost.len();
        totals.3 += rep.mismatched.len();
        totals.4 += rep.stuck.len();
        totals.5 += rep.left + usize::from(leaks.is_some());
        totals.6 += rep.orphans.len();
    }
    println!(
        "| **all** | {} | {} | **{}** | **{}** | **{}** | **{}** | **{}** | | | |",
        totals.0, totals.1, totals.2, totals.3, totals.4, totals.6, totals.5
    );
}
