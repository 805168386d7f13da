//! gvfs-proxy: serve a directory or an NFSv3 server over NFSv3.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gvfs_proxy::ProxyError;
use gvfs_proxy::config::{Config, ConfigError, FileConfig, UpstreamChoice};
use gvfs_proxy::exit::ExitCode as ProxyExit;
use tokio_util::sync::CancellationToken;

const ABOUT: &str = "A user-level NFSv3 caching proxy: serves a local directory (dir:PATH) or \
another NFSv3 server (nfs://...) to unmodified NFS clients: the Linux kernel, libnfs, QEMU.";

const AFTER_HELP: &str = "\
UPSTREAM URLS:
  dir:PATH                                  serve a local directory (the embedded origin)
  nfs://HOST[:PORT]/EXPORT[?mountport=N]    forward to an NFSv3 server or another gvfs-proxy;
                                            ports not given are asked of HOST's portmapper
  gvfs://HOST:PORT[/EXPORT][?name=NAME]     another gvfs-proxy's --listen-tls port, over mutually
                                            authenticated TLS 1.3 (needs --cert, --key, --ca;
                                            NAME: the server certificate's name if not HOST)

With no --upstream and no config file, the proxy serves ./gvfs-sample (created with sample
files) so you can try it at once.

The proxy answers PORTMAP on its own port, so listening on 127.0.0.N:111 (as root) lets
clients that always ask the portmapper (QEMU's nfs:// driver) find it without rpcbind.

EXAMPLES:
  gvfs-proxy
  gvfs-proxy --listen 127.0.0.1:2049 --upstream dir:/srv/images
  gvfs-proxy --listen 127.0.0.2:111 --upstream nfs://filer/export --export /images
  gvfs-proxy --upstream nfs://filer/export --cache-dir /var/cache/gvfs/vm1 --cache-size 8G
  gvfs-proxy --config /etc/gvfs/proxy.toml
  gvfs-proxy --config /etc/gvfs/proxy.toml --check

EXAMPLE CONFIGS (in the source tree):
  examples/deploy/   a TOML file per role (image-server.toml, lan-proxy.toml, node.toml),
                     their systemd units (Type=notify: READY=1 once serving), and a
                     Prometheus scrape config (prometheus.yml)
  cargo run --example site    a whole site on 127.0.0.1: image server, LAN proxy, two nodes

TLS BETWEEN PROXIES:
  gvfsctl ca init /etc/gvfs/ca
  gvfsctl ca issue --ca /etc/gvfs/ca --name image-server --ip 10.0.0.1
  gvfsctl ca issue --ca /etc/gvfs/ca --name node1
  # on the image server:
  gvfs-proxy --upstream dir:/srv/images --listen-tls 0.0.0.0:20049 \\
      --cert /etc/gvfs/ca/image-server.pem --key /etc/gvfs/ca/image-server-key.pem \\
      --ca /etc/gvfs/ca/ca.pem --map-peer node1=fixed:1000:1000
  # on a compute node:
  gvfs-proxy --upstream gvfs://10.0.0.1:20049/export --cache-dir /var/cache/gvfs \\
      --cert /etc/gvfs/ca/node1.pem --key /etc/gvfs/ca/node1-key.pem --ca /etc/gvfs/ca/ca.pem";

#[derive(Debug, Parser)]
#[command(
    name = "gvfs-proxy",
    version,
    about = ABOUT,
    after_help = format!("{AFTER_HELP}\n\n{}", ProxyExit::help())
)]
struct Cli {
    /// Every setting a config file may also hold (the same names: a
    /// file's `cache_size` is `--cache-size`).
    #[command(flatten)]
    settings: FileConfig,

    /// A TOML file with the same settings (command-line values win).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Log filter, e.g. info, debug, gvfs_proxy=trace; gvfs_proxy::front=trace
    /// logs every client call and gvfs_nfs::net::client=trace every upstream
    /// call, with latencies [default: info, or RUST_LOG].
    #[arg(long, value_name = "FILTER")]
    log: Option<String>,

    /// Map a peer's calls, by its certificate name: NAME=fixed:UID:GID,
    /// NAME=range:FIRST-LAST (caller's ids if inside, else nobody),
    /// NAME=pass or NAME=squash. Repeatable (a file's `[peers]` table).
    #[arg(long, value_name = "NAME=MAPPING", help_heading = "TLS")]
    map_peer: Vec<String>,

    /// Check the configuration and exit: print the stack it would build and
    /// what it would listen on (exit 0), or what is wrong (exit 2). Opens
    /// nothing: files, addresses and the upstream are checked at start.
    #[arg(long)]
    check: bool,

    /// Replace the proxy running with this configuration (found by its
    /// control socket) without unmounting: a hot upgrade. It pauses its
    /// FUSE mount, leaves its cache to this process and exits; this one
    /// then takes the mount over, and guests see a stall, not an error.
    /// With no proxy running, a start as usual.
    #[arg(long)]
    take_over: bool,

    /// Do not look for metadata files (a file's `meta = false`).
    #[arg(long, conflicts_with = "meta", help_heading = "Metadata actions")]
    no_meta: bool,

    /// Fetch every block, even one an image shares with images held here
    /// (a file's `dedup = false`).
    #[arg(long, conflicts_with = "dedup", help_heading = "Metadata actions")]
    no_dedup: bool,
}

impl Cli {
    /// The settings given on the command line.
    fn settings(&self) -> Result<FileConfig, ConfigError> {
        let mut settings = self.settings.clone();
        if !self.map_peer.is_empty() {
            let mut peers = std::collections::BTreeMap::new();
            for rule in &self.map_peer {
                let (name, mapping) = rule.split_once('=').ok_or_else(|| {
                    ConfigError::Invalid(format!("bad --map-peer {rule:?}: expected NAME=MAPPING"))
                })?;
                peers.insert(name.to_string(), mapping.to_string());
            }
            settings.tls.peers = Some(peers);
        }
        if self.no_meta {
            settings.meta.meta = Some(false);
        }
        if self.no_dedup {
            settings.meta.dedup = Some(false);
        }
        Ok(settings)
    }
}

fn main() -> ExitCode {
    // The keeper of a FUSE connection (started by a proxy serving a
    // mount) is this binary too; it runs on std alone, before anything.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args
        .get(1)
        .is_some_and(|a| a == gvfs_fuse::keeper::KEEPER_ARG)
    {
        return ExitCode::from(gvfs_fuse::keeper::run_keeper(&args[2..]));
    }
    // A FUSE connection systemd kept in its file descriptor store comes
    // back as fd 3 on: taken before anything opens a file.
    // SAFETY: no other thread runs yet, and nothing opened a descriptor.
    let passed = unsafe { gvfs_fuse::fdstore::take_passed() };
    gvfs_proxy::alloc::tune_for_large_buffers();
    let cli = Cli::parse();
    let filter = cli
        .log
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".into());
    gvfs_proxy::logs::init(&filter);
    passed.log();
    match real_main(cli, passed.stored) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gvfs-proxy: error: {e:#}");
            exit_code(&e).into()
        }
    }
}

/// The code to exit with after `e` (see `gvfs_proxy::exit`).
fn exit_code(e: &anyhow::Error) -> ProxyExit {
    if let Some(e) = e.downcast_ref::<ProxyError>() {
        e.exit_code()
    } else if e.downcast_ref::<ConfigError>().is_some() {
        ProxyExit::Config
    } else {
        ProxyExit::Failure
    }
}

fn real_main(cli: Cli, stored: Option<gvfs_fuse::fdstore::StoredFd>) -> anyhow::Result<()> {
    let file = match &cli.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let mut cfg = Config::from_file_config(file.overridden_by(cli.settings()?)?)?;
    cfg.mount_stored = stored;
    if cli.check {
        let what = match &cli.config {
            Some(path) => path.display().to_string(),
            None => "the command line".to_owned(),
        };
        println!("{what}: configuration OK");
        print!("{}", gvfs_proxy::check::summary(&cfg));
        println!("{}", gvfs_proxy::check::NOT_CHECKED);
        return Ok(());
    }
    let sample = matches!(cfg.upstream, UpstreamChoice::Sample(_));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        gvfs_proxy::shutdown::cancel_on_signals(shutdown.clone()).map_err(ProxyError::Signals)?;
        let stopping = shutdown.clone();
        tokio::spawn(async move {
            stopping.cancelled().await;
            gvfs_proxy::notify::notify(&[gvfs_proxy::notify::NotifyState::Stopping]);
        });
        if cli.take_over {
            gvfs_proxy::handover::replace_running(&cfg).await?;
        }
        gvfs_proxy::run(cfg, shutdown, |r| print_ready(r, sample)).await?;
        Ok(())
    })
}

fn print_ready(r: &gvfs_proxy::Ready, sample: bool) {
    match r.addr {
        Some(addr) => println!("listening on {addr}"),
        None => println!("no NFS listener (--listen none)"),
    }
    println!(
        "gvfs-proxy {}: serving {} as {}",
        env!("CARGO_PKG_VERSION"),
        r.upstream,
        r.export
    );
    if let Some(cache) = &r.cache {
        println!("  block cache in {cache}");
    }
    if let Some(name) = &r.tls_name {
        let starttls = r
            .addr
            .map(|a| format!("RFC 9289 STARTTLS on {a}"))
            .unwrap_or_default();
        match r.tls_addr {
            Some(a) => println!("  TLS as {name}: gvfs:// peers connect to {a}; {starttls}"),
            None => println!("  TLS as {name}: {starttls}"),
        }
    }
    if let Some(dir) = &r.mount {
        println!("  mounted at {} through FUSE", dir.display());
    }
    if sample {
        println!("  (no --upstream given: this is the sample directory; see gvfs-proxy --help)");
    }
    println!("Use it:");
    if let Some(addr) = r.addr {
        print_nfs_use(addr, &r.export);
    }
    if let Some(dir) = &r.mount {
        println!("  files:  ls {}", dir.display());
    }
    println!("  status: gvfsctl --control {} status", r.control.display());
    println!("Stop with Ctrl-C (or SIGTERM).");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // Under systemd (Type=notify): every listener is bound and the
    // upstream answered.
    let status = format!("serving {} as {}", r.upstream, r.export);
    gvfs_proxy::notify::notify(&[
        gvfs_proxy::notify::NotifyState::Ready,
        gvfs_proxy::notify::NotifyState::Status(&status),
    ]);
}

/// How to reach the NFS listener at `addr`.
fn print_nfs_use(addr: std::net::SocketAddr, export: &str) {
    let (ip, port) = (addr.ip(), addr.port());
    let host = if addr.is_ipv6() {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    println!(
        "  Linux:  sudo mount -t nfs -o vers=3,proto=tcp,port={port},mountport={port},nolock {host}:{export} /mnt"
    );
    println!("  libnfs: nfs-ls 'nfs://{host}{export}?version=3&nfsport={port}&mountport={port}'");
    if port == 111 {
        println!("  QEMU:   qemu-img info nfs://{host}{export}/FILE");
    }
}
