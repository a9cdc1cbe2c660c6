//! `sandboxctl doctor`: the daemon's self-audit (`sandboxd.v1.Admin/Audit`) as a table or JSON.

use sandboxd::api::admin::{admin_client::AdminClient, AuditRequest, AuditResponse};
use tonic::transport::Channel;

pub async fn run(ch: &Channel, fix: bool, grace: i64, json: bool) -> Result<(), String> {
    let r = AdminClient::new(ch.clone())
        .audit(AuditRequest {
            fix,
            grace_seconds: grace,
        })
        .await
        .map_err(|s| crate::grpc_err("Audit", s))?
        .into_inner();
    if json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap());
    } else {
        print_table(&r, fix);
    }
    let left = r.orphans.iter().filter(|o| !o.fixed).count();
    match left {
        0 => Ok(()),
        n => Err(format!("{n} orphan(s) left on the host")),
    }
}

fn print_table(r: &AuditResponse, fix: bool) {
    println!(
        "{:<18} {:<14} {:>8}  {:<8} PATH",
        "KIND", "OWNER", "AGE", "STATE"
    );
    for o in &r.orphans {
        let state = match (o.fixed, o.error.is_empty(), fix) {
            (true, _, _) => "removed".to_string(),
            (false, false, _) => format!("error: {}", o.error),
            (false, true, true) => "too new".to_string(),
            (false, true, false) => "orphan".to_string(),
        };
        let age = match o.age_seconds {
            a if a < 0 => "?".to_string(),
            a if a < 120 => format!("{a}s"),
            a if a < 7200 => format!("{}m", a / 60),
            a => format!("{}h", a / 3600),
        };
        println!(
            "{:<18} {:<14} {:>8}  {:<8} {}",
            o.kind,
            crate::output::short(&o.owner),
            age,
            state,
            o.path
        );
    }
    println!(
        "{} orphan(s), audit took {} ms",
        r.orphans.len(),
        r.took_micros / 1000
    );
}
