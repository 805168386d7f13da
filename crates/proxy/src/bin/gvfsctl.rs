//! gvfsctl: control a running gvfs-proxy over its control socket.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(
    name = "gvfsctl",
    version,
    about = "Control a running gvfs-proxy",
    after_help = "Without --control, gvfsctl uses the only gvfs-proxy control socket in \
$XDG_RUNTIME_DIR (or /tmp); with several proxies running, name one with --control."
)]
struct Cli {
    /// The proxy's control socket (printed by gvfs-proxy at start).
    #[arg(long, global = true, value_name = "PATH")]
    control: Option<PathBuf>,

    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Show what the proxy serves, its connections and call counters.
    Status {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gvfsctl: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn control_path(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p);
    }
    let found = gvfs_proxy::control::discover();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!(
            "no running gvfs-proxy found in {} (start one, or pass --control PATH)",
            gvfs_proxy::config::runtime_dir().display()
        ),
        many => bail!(
            "several proxies are running; pick one with --control: {}",
            many.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let path = control_path(cli.control)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match cli.cmd {
        Cmd::Status { json } => {
            let status = runtime
                .block_on(gvfs_proxy::control::request(
                    &path,
                    &json!({"cmd": "status"}),
                ))
                .map_err(anyhow::Error::msg)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print_status(&status);
            }
        }
    }
    Ok(())
}

fn print_status(s: &Value) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    println!(
        "gvfs-proxy {} (pid {})",
        s["version"].as_str().unwrap_or("?"),
        n(&s["pid"])
    );
    println!(
        "  listening   {}  export {}",
        s["listen"].as_str().unwrap_or("?"),
        s["export"].as_str().unwrap_or("?")
    );
    println!("  upstream    {}", s["upstream"].as_str().unwrap_or("?"));
    println!("  uptime      {} s", n(&s["uptime_secs"]));
    let c = &s["connections"];
    println!(
        "  connections {} open, {} accepted, {} closed for oversized records",
        n(&c["open"]),
        n(&c["accepted"]),
        n(&c["closed_oversized"])
    );
    println!(
        "  data        {} bytes read, {} bytes written",
        n(&s["read_bytes"]),
        n(&s["write_bytes"])
    );
    println!(
        "  errors      {} RPC-level, {} upstream; {} retransmissions answered from the duplicate-request cache",
        n(&s["rpc_errors"]),
        n(&s["service_errors"]),
        n(&s["drc_hits"])
    );
    if let Some(calls) = s["nfs_calls"].as_object() {
        let list: Vec<String> = calls.iter().map(|(k, v)| format!("{k} {}", n(v))).collect();
        println!(
            "  NFS calls   {}",
            if list.is_empty() {
                "none".into()
            } else {
                list.join(", ")
            }
        );
    }
    println!(
        "  MOUNT calls {}  PORTMAP calls {}",
        n(&s["mount_calls"]),
        n(&s["portmap_calls"])
    );
    let u = &s["upstream_client"];
    if u.is_object() {
        println!(
            "  upstream rpc {}: {} calls, {} retransmits, {} connects",
            u["server"].as_str().unwrap_or("?"),
            n(&u["calls"]),
            n(&u["retransmits"]),
            n(&u["connects"])
        );
    }
}
