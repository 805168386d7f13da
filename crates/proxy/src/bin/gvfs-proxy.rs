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
    /// Address to listen on [default: 127.0.0.1:2049]. Plain NFS binds only
    /// loopback addresses unless --allow-remote is given.
    #[arg(long, value_name = "IP:PORT")]
    listen: Option<String>,

    /// What to serve: dir:PATH, nfs://HOST[:PORT]/EXPORT[?mountport=N] or
    /// gvfs://HOST:PORT[/EXPORT][?name=NAME] (see UPSTREAM URLS below).
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,

    /// The export path clients mount [default: /export].
    #[arg(long, value_name = "/NAME")]
    export: Option<String>,

    /// A TOML file with the same settings (command-line values win).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Control socket for gvfsctl [default: $XDG_RUNTIME_DIR or /tmp,
    /// gvfs-proxy-IP-PORT.sock].
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,

    /// Allow a plain (unencrypted) listener on a non-loopback address.
    #[arg(long)]
    allow_remote: bool,

    /// Give up on an upstream call after SECS and report an I/O error to the
    /// client; 0 waits forever like a hard mount, so an upstream outage only
    /// delays clients [default: 0].
    #[arg(long, value_name = "SECS")]
    upstream_timeout: Option<u64>,

    /// Timeout of one upstream connection attempt [default: 5].
    #[arg(long, value_name = "SECS")]
    connect_timeout: Option<u64>,

    /// Client connections served at once [default: 256]. When all are
    /// taken, a new client is served by closing the connection idle
    /// longest (one with no call running); if every one is busy, it waits.
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,

    /// Connections not yet through their first call (or TLS handshake) at
    /// once, besides --max-connections; one more closes the oldest, so
    /// sockets that send nothing cannot keep clients out [default: 64].
    #[arg(long, value_name = "N")]
    max_pending_connections: Option<usize>,

    /// Close a client connection that has nothing running and sends no
    /// call for SECS [default: 600]. A new connection must send its first
    /// call within 10 s, and a call once begun must be complete within 30 s.
    #[arg(long, value_name = "SECS")]
    idle_timeout: Option<u64>,

    /// Most memory for call records and replies held at once, all client
    /// connections together, e.g. 256M [default: 256M]. A connection whose
    /// client does not read its replies stops being read once it holds a
    /// quarter of it; every client may still send one call at a time.
    #[arg(long, value_name = "SIZE")]
    buffer_memory: Option<String>,

    /// Calls in flight per client connection [default: 64].
    #[arg(long, value_name = "N")]
    max_in_flight: Option<usize>,

    /// Log filter, e.g. info, debug, gvfs_proxy=trace; gvfs_proxy::front=trace
    /// logs every client call and gvfs_nfs::net::client=trace every upstream
    /// call, with latencies [default: info, or RUST_LOG].
    #[arg(long, value_name = "FILTER")]
    log: Option<String>,

    /// Serve Prometheus metrics (the counters of `gvfsctl status` and
    /// `gvfsctl stats`) at http://ADDR/metrics; loopback only unless
    /// --allow-remote.
    #[arg(long, value_name = "IP:PORT")]
    metrics: Option<String>,

    /// Keep a block cache in DIR (bank files); without it the proxy only
    /// forwards. The cache stays warm across restarts.
    #[arg(long, value_name = "DIR", help_heading = "Block cache")]
    cache_dir: Option<PathBuf>,

    /// Cache capacity, e.g. 4G, 512M [default: 1G].
    #[arg(long, value_name = "SIZE", help_heading = "Block cache")]
    cache_size: Option<String>,

    /// Cache banks (files) [default: 16].
    #[arg(long, value_name = "N", help_heading = "Block cache")]
    cache_banks: Option<u32>,

    /// Cache associativity, frames per set [default: 16].
    #[arg(long, value_name = "N", help_heading = "Block cache")]
    cache_ways: Option<u32>,

    /// Cache block size, a power of two from 4K to 1M [default: 64K].
    #[arg(long, value_name = "SIZE", help_heading = "Block cache")]
    block_size: Option<String>,

    /// write-back (writes stay in the cache until `gvfsctl writeback`,
    /// `flush`, SIGUSR1/SIGUSR2 or exit) or write-through [default: write-back].
    #[arg(long, value_name = "POLICY", help_heading = "Block cache")]
    write_policy: Option<String>,

    /// Most blocks to read ahead on sequential access (as many as the
    /// sequential run has read so far, up to N); 0 turns it off [default: 32].
    #[arg(long, value_name = "N", help_heading = "Block cache")]
    readahead: Option<u32>,

    /// Do not write dirty data back on SIGTERM/SIGINT (it stays in the cache
    /// for the next start).
    #[arg(long, help_heading = "Block cache")]
    no_writeback_on_exit: bool,

    /// Longest write-back on exit [default: 60].
    #[arg(long, value_name = "SECS", help_heading = "Block cache")]
    exit_writeback_timeout: Option<u64>,

    /// Accept gvfs:// peers (other proxies) over TLS 1.3 here; they must
    /// present a certificate signed by --ca.
    #[arg(long, value_name = "IP:PORT", help_heading = "TLS")]
    listen_tls: Option<String>,

    /// This node's certificate (PEM), from `gvfsctl ca issue`.
    #[arg(long, value_name = "FILE", help_heading = "TLS")]
    cert: Option<PathBuf>,

    /// This node's private key (PEM).
    #[arg(long, value_name = "FILE", help_heading = "TLS")]
    key: Option<PathBuf>,

    /// The site CA certificate (PEM) that peers' certificates must chain to.
    #[arg(long, value_name = "FILE", help_heading = "TLS")]
    ca: Option<PathBuf>,

    /// Map a peer's calls, by its certificate name: NAME=fixed:UID:GID,
    /// NAME=range:FIRST-LAST (caller's ids if inside, else nobody),
    /// NAME=pass or NAME=squash. Repeatable.
    #[arg(long, value_name = "NAME=MAPPING", help_heading = "TLS")]
    map_peer: Vec<String>,

    /// Mapping of peers with no --map-peer rule [default: squash].
    #[arg(long, value_name = "MAPPING", help_heading = "TLS")]
    unknown_peers: Option<String>,

    /// Longest TLS handshake [default: 10].
    #[arg(long, value_name = "SECS", help_heading = "TLS")]
    handshake_timeout: Option<u64>,

    /// Use metadata files found upstream (`.NAME.gvfsmeta`, made with
    /// `gvfsctl meta gen`): reads of zero blocks are answered locally,
    /// files marked for compress-and-copy are fetched whole, compressed,
    /// into a file cache, and other proxies fetching them whole are sent
    /// each repeated block once [default: on when there is a block cache or
    /// a --listen-tls port].
    #[arg(long, conflicts_with = "no_meta", help_heading = "Metadata actions")]
    meta: bool,

    /// Most bytes of whole files kept by compress-and-copy (in
    /// CACHE_DIR/files), e.g. 16G [default: 16G].
    #[arg(long, value_name = "SIZE", help_heading = "Metadata actions")]
    file_cache_size: Option<String>,

    /// Do not look for metadata files.
    #[arg(long, help_heading = "Metadata actions")]
    no_meta: bool,

    /// Answer GETATTR, LOOKUP, ACCESS, FSINFO, PATHCONF, MNT and NULL
    /// locally from replies at most SECS old, like a client's actimeo: saves
    /// the round trips every client session starts with. A directory's
    /// first LOOKUP also reads it (READDIRPLUS) to answer the names after
    /// it. For read-only
    /// images; changes made upstream by others show within SECS. Calls that
    /// change anything through this proxy empty it [default: 0, off].
    #[arg(long, value_name = "SECS")]
    attr_timeout: Option<u64>,
}

impl Cli {
    fn file_config(&self) -> anyhow::Result<FileConfig> {
        let mut peers = std::collections::BTreeMap::new();
        for rule in &self.map_peer {
            let (name, mapping) = rule.split_once('=').ok_or_else(|| {
                ConfigError::Invalid(format!("bad --map-peer {rule:?}: expected NAME=MAPPING"))
            })?;
            peers.insert(name.to_string(), mapping.to_string());
        }
        Ok(FileConfig {
            listen: self.listen.clone(),
            upstream: self.upstream.clone(),
            export: self.export.clone(),
            control: self.control.clone(),
            allow_remote: self.allow_remote.then_some(true),
            upstream_timeout_secs: self.upstream_timeout,
            connect_timeout_secs: self.connect_timeout,
            max_connections: self.max_connections,
            max_pending_connections: self.max_pending_connections,
            idle_timeout_secs: self.idle_timeout,
            buffer_memory: self.buffer_memory.clone(),
            max_in_flight: self.max_in_flight,
            drain_timeout_secs: None,
            metrics: self.metrics.clone(),
            cache_dir: self.cache_dir.clone(),
            cache_size: self.cache_size.clone(),
            file_cache_size: self.file_cache_size.clone(),
            cache_banks: self.cache_banks,
            cache_ways: self.cache_ways,
            block_size: self.block_size.clone(),
            write_policy: self.write_policy.clone(),
            readahead_blocks: self.readahead,
            writeback_on_exit: self.no_writeback_on_exit.then_some(false),
            exit_writeback_timeout_secs: self.exit_writeback_timeout,
            listen_tls: self.listen_tls.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            ca: self.ca.clone(),
            handshake_timeout_secs: self.handshake_timeout,
            peers: (!peers.is_empty()).then_some(peers),
            unknown_peers: self.unknown_peers.clone(),
            nobody: None,
            attr_timeout_secs: self.attr_timeout,
            meta: match (self.meta, self.no_meta) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
        })
    }
}

fn main() -> ExitCode {
    gvfs_proxy::alloc::tune_for_large_buffers();
    let cli = Cli::parse();
    let filter = cli
        .log
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .init();
    match real_main(cli) {
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

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let file = match &cli.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let cfg = Config::from_file_config(file.overridden_by(cli.file_config()?))?;
    let sample = matches!(cfg.upstream, UpstreamChoice::Sample(_));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        gvfs_proxy::shutdown::cancel_on_signals(shutdown.clone()).map_err(ProxyError::Signals)?;
        gvfs_proxy::run(cfg, shutdown, |r| print_ready(r, sample)).await?;
        Ok(())
    })
}

fn print_ready(r: &gvfs_proxy::Ready, sample: bool) {
    let (ip, port) = (r.addr.ip(), r.addr.port());
    let host = if r.addr.is_ipv6() {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    let export = &r.export;
    let libnfs_export = if export == "/" {
        "/".to_string()
    } else {
        export.clone()
    };
    println!("listening on {}", r.addr);
    println!(
        "gvfs-proxy {}: serving {} as {export}",
        env!("CARGO_PKG_VERSION"),
        r.upstream
    );
    if let Some(cache) = &r.cache {
        println!("  block cache in {cache}");
    }
    if let Some(name) = &r.tls_name {
        match r.tls_addr {
            Some(a) => println!(
                "  TLS as {name}: gvfs:// peers connect to {a}; RFC 9289 STARTTLS on {}",
                r.addr
            ),
            None => println!("  TLS as {name}: RFC 9289 STARTTLS on {}", r.addr),
        }
    }
    if sample {
        println!("  (no --upstream given: this is the sample directory; see gvfs-proxy --help)");
    }
    println!("Use it:");
    println!(
        "  Linux:  sudo mount -t nfs -o vers=3,proto=tcp,port={port},mountport={port},nolock {host}:{export} /mnt"
    );
    println!(
        "  libnfs: nfs-ls 'nfs://{host}{libnfs_export}?version=3&nfsport={port}&mountport={port}'"
    );
    if port == 111 {
        println!("  QEMU:   qemu-img info nfs://{host}{export}/FILE");
    }
    println!("  status: gvfsctl --control {} status", r.control.display());
    println!("Stop with Ctrl-C (or SIGTERM).");
    use std::io::Write;
    let _ = std::io::stdout().flush();
}
