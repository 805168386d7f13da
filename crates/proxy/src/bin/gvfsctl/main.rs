//! gvfsctl: control a running gvfs-proxy over its control socket, make
//! the certificates for TLS between proxies (`gvfsctl ca`), and make and
//! show metadata files (`gvfsctl meta`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use serde_json::json;

mod control;
use control::control_path;

mod learned;

mod meta;
use meta::{MetaCmd, meta};

mod no_huge_pages;

mod show;

mod vm;
use show::{NOT_UNDERSTOOD, print_stats, print_status, wait_for_job};
use vm::VmCmd;

#[derive(Debug, Parser)]
#[command(
    name = "gvfsctl",
    version,
    about = "Control a running gvfs-proxy (status, stats, writeback, flush, learned, unmount); make a site CA and \
node certificates (ca); make and show metadata files (meta); run a VM monitor for lazy clones \
(no-huge-pages); save, clone and list VMs (vm)",
    after_help = "Without --control, gvfsctl uses the only gvfs-proxy control socket in \
$XDG_RUNTIME_DIR (or /tmp); with several proxies running, name one with --control. \
`ca`, `meta`, `no-huge-pages` and `vm` work locally and need no proxy."
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
    /// Block cache counters: hits, misses, bytes served and fetched,
    /// read-ahead, dirty bytes, upstream calls and latency.
    Stats {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the cache's dirty data back upstream (the cache stays warm).
    Writeback {
        /// Wait until it is done, with a progress bar.
        #[arg(long)]
        wait: bool,
    },
    /// Write back, then drop the cached data; waits until done.
    Flush,
    /// End the proxy's FUSE mount for good: the proxy unmounts it and
    /// exits. (A stop while files are open on the mount, or a crash, only
    /// pauses it: the same command started again takes it over.) Refused
    /// while files are open, unless --force.
    Unmount {
        /// Unmount even with files open: the guests that map them fail.
        #[arg(long)]
        force: bool,
    },
    /// Tell a lazy clone's node that its guest is ready (it answered):
    /// the working sets it is learning are published now (kept and sent
    /// upstream, for the next clones to fetch first) instead of when their
    /// window closes (--learn-window) or the guest goes quiet.
    Learned {
        /// Only the files of this name (the last part of their path, e.g.
        /// `mem`), as the proxy last looked them up; without, every file.
        name: Option<String>,
        /// Wait (at most 10 s) until they were published, and say how:
        /// sent upstream, or not kept (a copy, most of the image, nothing
        /// new). Fails if one was not sent in time or upstream refused it.
        #[arg(long)]
        wait: bool,
    },
    /// Make the site CA and node certificates for TLS between proxies
    /// (runs locally; no proxy needed).
    Ca {
        #[command(subcommand)]
        cmd: CaCmd,
    },
    /// Make and show `.NAME.gvfsmeta` metadata files: zero-block maps and
    /// compress-and-copy actions (runs locally; no proxy needed).
    Meta {
        #[command(subcommand)]
        cmd: MetaCmd,
    },
    /// Run a command (a VM monitor) with `madvise(MADV_HUGEPAGE)` made a
    /// no-op, for lazy clones: QEMU advises huge pages on all guest RAM,
    /// and Linux then reads a privately mapped memory image 4 MiB at a
    /// time around each first fault (whatever the mount's read-ahead), so
    /// a guest mapping its RAM from a gvfs mount would pull most of the
    /// image to touch a small part of it. A seccomp filter, kept across
    /// exec and by every thread, answers that advice with success and does
    /// nothing; the program is unchanged. Runs locally; no proxy needed.
    #[command(name = "no-huge-pages")]
    NoHugePages {
        /// The command and its arguments (after `--`).
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Clone VMs: save a running QEMU as a golden image, start clones of
    /// it (lazily through a gvfs mount, or copy-first), list golden
    /// images (runs locally; no proxy needed).
    Vm {
        #[command(subcommand)]
        cmd: VmCmd,
    },
}

#[derive(Debug, Subcommand)]
enum CaCmd {
    /// Create a site CA: DIR/ca.pem and DIR/ca-key.pem (keep the key private).
    Init {
        /// Where to put the CA (created 0700 if missing).
        dir: PathBuf,
        /// The CA certificate's common name.
        #[arg(long, default_value = "gvfs site CA")]
        name: String,
        /// Validity in days.
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Issue a node certificate signed by the site CA: OUT/NAME.pem and
    /// OUT/NAME-key.pem, usable to serve and to connect.
    Issue {
        /// The CA directory (made by `gvfsctl ca init`).
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
        /// The node's name: the certificate CN, which image servers map to
        /// a uid/gid.
        #[arg(long)]
        name: String,
        /// An IP address the node is reached at (repeatable).
        #[arg(long = "ip", value_name = "IP")]
        ips: Vec<String>,
        /// A DNS name the node is reached at (repeatable).
        #[arg(long = "dns", value_name = "NAME")]
        dns: Vec<String>,
        /// Validity in days.
        #[arg(long, default_value_t = 825)]
        days: u32,
        /// Where to write the files (default: the CA directory).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::Vm { cmd } = cli.cmd {
        // A clone exits with its QEMU's status.
        return vm::vm(cmd).unwrap_or_else(|e| {
            eprintln!("gvfsctl: error: {e:#}");
            ExitCode::FAILURE
        });
    }
    match real_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gvfsctl: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    // `gvfsctl ca` works on files only: no control socket to look for.
    let cmd = match cli.cmd {
        Cmd::Ca { cmd } => return ca(cmd),
        Cmd::Meta { cmd } => return meta(cmd, cli.control),
        Cmd::NoHugePages { command } => return no_huge_pages::exec(&command),
        cmd => cmd,
    };
    let path = control_path(cli.control)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let request = |req: &serde_json::Value| {
        runtime
            .block_on(gvfs_proxy::control::request(&path, req))
            .map_err(anyhow::Error::msg)
    };
    let ask = |cmd: &str| request(&json!({ "cmd": cmd }));
    match cmd {
        Cmd::Status { json } => {
            let status = ask("status")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print_status(&serde_json::from_value(status).context(NOT_UNDERSTOOD)?);
            }
        }
        Cmd::Stats { json } => {
            let stats = ask("stats")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&stats)?);
            } else {
                print_stats(&serde_json::from_value(stats).context(NOT_UNDERSTOOD)?);
            }
        }
        Cmd::Writeback { wait } => {
            let started = ask("writeback")?;
            if wait {
                wait_for_job(&ask, &started)?;
            } else {
                let total = started["job"]["total_bytes"].as_u64().unwrap_or(0);
                match started["started"].as_bool() {
                    Some(true) => println!("write-back started: {total} dirty bytes"),
                    _ => println!("a write-back is already running"),
                }
            }
        }
        Cmd::Flush => {
            let started = ask("flush")?;
            wait_for_job(&ask, &started)?;
        }
        Cmd::Learned { name, wait } => learned::learned(&request, name.as_deref(), wait)?,
        Cmd::Unmount { force } => {
            let done = request(&json!({ "cmd": "unmount", "force": force }))?;
            println!(
                "unmounting {} ({} files open); the proxy exits",
                done["unmounting"].as_str().unwrap_or("?"),
                done["open"].as_u64().unwrap_or(0)
            );
        }
        Cmd::Ca { .. } | Cmd::Meta { .. } | Cmd::NoHugePages { .. } | Cmd::Vm { .. } => {
            unreachable!("local commands are handled before the control socket lookup")
        }
    }
    Ok(())
}

/// `gvfsctl ca init|issue`: makes the site CA and node certificates.
fn ca(cmd: CaCmd) -> anyhow::Result<()> {
    match cmd {
        CaCmd::Init { dir, name, days } => {
            let cert = gvfs_tunnel::pki::init_ca(&dir, &name, days)?;
            println!("site CA {name:?} created: {}", cert.display());
            println!(
                "its key {} signs node certificates; keep it private",
                dir.join(gvfs_tunnel::pki::CA_KEY_FILE).display()
            );
            println!(
                "next: gvfsctl ca issue --ca {} --name NODE [--ip IP]... [--dns NAME]...",
                dir.display()
            );
        }
        CaCmd::Issue {
            ca,
            name,
            ips,
            dns,
            days,
            out,
        } => {
            let ips = ips
                .iter()
                .map(|ip| {
                    ip.parse::<std::net::IpAddr>()
                        .with_context(|| format!("--ip {ip:?} is not an IP address"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let out = out.unwrap_or_else(|| ca.clone());
            let mut opts = gvfs_tunnel::pki::IssueOptions::new(name.clone(), days);
            opts.ips = ips;
            opts.dns = dns;
            let (cert, key) = gvfs_tunnel::pki::issue(&ca, &out, &opts)?;
            println!("node certificate for {name:?}: {}", cert.display());
            println!("its key: {}", key.display());
            println!(
                "use with: gvfs-proxy --cert {} --key {} --ca {}",
                cert.display(),
                key.display(),
                ca.join(gvfs_tunnel::pki::CA_CERT_FILE).display()
            );
        }
    }
    Ok(())
}
