//! The sandboxd binary. Until the CRI server lands, its one job is `sandboxd demo`: one pod
//! sandbox lifecycle through the library with the default config, printing the netns, the
//! IP and the time of each step.

use std::time::Instant;

use sandboxd::{Config, NamespaceMode, PodSandboxConfig, PodSandboxMetadata, Runtime};

const USAGE: &str = "usage: sandboxd demo [--infra] [--root DIR] [--netns-dir DIR]\n\
  demo       run, inspect, stop and remove one pod sandbox through the library\n\
  --infra    give the pod a shared PID namespace, so it runs the pause process\n";

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some("demo") {
        eprint!("{USAGE}");
        std::process::exit(2);
    }
    let mut cfg = Config::default();
    let mut infra = false;
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--infra" => infra = true,
            "--root" => cfg.root = it.next().map(Into::into).unwrap_or_else(|| usage()),
            "--netns-dir" => cfg.netns_dir = it.next().map(Into::into).unwrap_or_else(|| usage()),
            _ => usage(),
        }
    }
    if let Err(e) = demo(cfg, infra) {
        eprintln!("sandboxd demo: {e}");
        std::process::exit(1);
    }
}

fn usage() -> ! {
    eprint!("{USAGE}");
    std::process::exit(2)
}

fn demo(cfg: Config, infra: bool) -> Result<(), sandboxd::Error> {
    let t = Instant::now();
    let rt = Runtime::new(cfg)?;
    println!("runtime opened (state restored) in {:.1} ms", ms(t));
    let uid = sandboxd::validate::new_id()[..12].to_string();
    let mut pod = PodSandboxConfig {
        metadata: PodSandboxMetadata {
            name: "demo".into(),
            namespace: "default".into(),
            uid,
            attempt: 0,
        },
        ..Default::default()
    };
    pod.namespace_options.pid = if infra {
        NamespaceMode::Pod
    } else {
        NamespaceMode::Container
    };
    let net = rt
        .network()
        .map_err(|e| sandboxd::Error::Config(e.to_string()))?;
    println!("network: {} (from {})", net.name, net.source);

    let t = Instant::now();
    let id = rt.run_pod_sandbox(&pod)?;
    println!("run     {:>8.1} ms  sandbox {id}", ms(t));
    let t = Instant::now();
    let st = rt.pod_sandbox_status(&id)?;
    println!(
        "status  {:>8.1} ms  state {:?}, infra {:?}",
        ms(t),
        st.state,
        st.infra_mode
    );
    if let Some(p) = &st.netns_path {
        println!("        netns {}", p.display());
    }
    println!("        ips   {}", st.ips.join(", "));
    if let Some(pid) = st.infra_pid {
        println!("        infra pid {pid}");
    }
    let t = Instant::now();
    rt.stop_pod_sandbox(&id)?;
    println!("stop    {:>8.1} ms", ms(t));
    let t = Instant::now();
    rt.remove_pod_sandbox(&id)?;
    println!("remove  {:>8.1} ms", ms(t));
    Ok(())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
