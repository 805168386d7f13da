//! A whole gvfs site on 127.0.0.1, in one command:
//!
//! ```text
//! cargo run --example site            # stop with Ctrl-C
//! cargo run --example site -- --once  # do it all, then stop
//! ```
//!
//! In a temporary directory it makes an origin with one small golden image
//! (zero blocks, blocks repeated, data) and its metadata (`gvfsctl meta gen
//! --compress`), a site CA and a certificate per proxy (`gvfsctl ca`), then
//! starts, bottom first:
//!
//! ```text
//!  node1        node2          gvfs-proxy --cache-dir: NFS clients mount these
//!     \          /             mutual TLS 1.3 (gvfs://)
//!      lan-proxy               gvfs-proxy --cache-dir --listen-tls: the site's cache
//!          |                   mutual TLS 1.3 (the WAN, in a real site)
//!     image-server             gvfs-proxy --listen-tls, upstream dir:ORIGIN
//! ```
//!
//! It prints each proxy's command line and how to mount the nodes, reads
//! the image through both nodes (libnfs' `nfs-cat` when installed, else
//! gvfs' own NFS client) and checks every byte, shows `gvfsctl stats` of
//! each proxy, then waits for Ctrl-C (SIGINT) or SIGTERM and stops the
//! proxies, top first, each with SIGTERM. Runs as any user: every port is
//! a free one on 127.0.0.1 and nothing is mounted.
//!
//! The site is the test bed's `gvfs_testbed::Site`; the proxies are the
//! `gvfs-proxy` binary, built first (`examples/common`).

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gvfs_testbed::data::compare_bytes;
use gvfs_testbed::proxy::{Proxy, gvfsctl, gvfsctl_local};
use gvfs_testbed::site::{self, Origin, Site, Tier};

/// The golden image, in the origin.
const IMAGE: &str = "images/golden.img";
/// Its size: six 1 MiB chunks of compress-and-copy.
const IMAGE_SIZE: usize = 6 << 20;
/// The zero-map block size `gvfsctl meta gen` uses by default.
const BLOCK: usize = 4096;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("site: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mut once = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--once" => once = true,
            "-h" | "--help" => {
                println!("usage: cargo run --example site [-- --once]");
                return Ok(());
            }
            other => {
                bail!("unknown argument {other:?} (usage: cargo run --example site [-- --once])")
            }
        }
    }
    common::catch_stop_signals()?;
    common::build_binaries()?;
    let mut example = Example::start()?;
    let outcome = example.show_and_check();
    if outcome.is_ok() && !once {
        println!("\nThe site runs until Ctrl-C (or SIGTERM).");
        common::wait_for_stop();
        println!();
    }
    let stopped = example.stop();
    outcome.and(stopped)?;
    drop(example);
    println!("site stopped; its directory is removed");
    Ok(())
}

/// The site ([`gvfs_testbed::Site`]) and each proxy's metrics endpoint.
struct Example {
    site: Site,
    metrics: BTreeMap<String, SocketAddr>,
}

impl Example {
    fn start() -> Result<Self> {
        // Each proxy's metrics endpoint on a free port, and warnings only.
        let mut metrics = BTreeMap::new();
        let mut tier = |name: &str, tier: Tier| -> Result<Tier> {
            let at = free_port()?;
            metrics.insert(name.to_owned(), at);
            Ok(tier.args(move |a| a.metrics(at).env("RUST_LOG", "warn")))
        };
        let image_server = tier(site::IMAGE_SERVER, Tier::new())?;
        let lan = tier(site::LAN, cached())?;
        let node1 = tier(&site::node_name(0), cached())?;
        let node2 = tier(&site::node_name(1), cached())?;
        let site = Site::builder(Origin::Dir)
            .pki()
            .image_server(image_server)
            .lan(lan)
            .node(node1)
            .node(node2)
            .start_with(|origin| {
                let image = origin.join(IMAGE);
                std::fs::create_dir_all(image.parent().context("the image has a directory")?)?;
                std::fs::write(&image, golden_image())?;
                let image_s = image.display().to_string();
                println!(
                    "origin {}: {IMAGE}, {} MiB",
                    origin.display(),
                    IMAGE_SIZE >> 20
                );
                println!("$ gvfsctl meta gen --compress {image_s}");
                gvfsctl_local(&["meta", "gen", "--compress", &image_s])?;
                print!("{}", indent(&gvfsctl_local(&["meta", "show", &image_s])?));
                common::stop_requested()
            })?;
        let ca = site.pki().context("the site has a PKI")?.ca_dir();
        println!("$ gvfsctl ca init {}", ca.display());
        for p in site.proxies() {
            println!(
                "$ gvfsctl ca issue --ca {} --name {} --ip 127.0.0.1",
                ca.display(),
                p.name()
            );
        }
        for p in site.proxies() {
            let mut words = p.args().clone().listen(p.addr()).to_args();
            if let Some(i) = words.iter().position(|w| w == "--listen-tls")
                && let Some(at) = words.get_mut(i + 1)
                && let Some(tls) = p.tls_addr()
            {
                *at = tls.to_string();
            }
            println!(
                "\n{}: serving on {}\n  $ gvfs-proxy {}",
                p.name(),
                p.addr(),
                shell_words(&words)
            );
        }
        common::stop_requested()?;
        Ok(Self { site, metrics })
    }

    /// Prints how to use the site, reads the image through both nodes
    /// (every byte checked), and prints each proxy's stats.
    fn show_and_check(&self) -> Result<()> {
        let golden = std::fs::read(self.site.origin_dir().join(IMAGE))?;
        println!(
            "\nMount a node (any NFSv3 client; QEMU's nfs:// needs port 111, as root: --listen 127.0.0.N:111):"
        );
        for node in self.site.nodes() {
            println!("  {}:", node.name());
            println!(
                "    Linux:  sudo mount -t nfs -o vers=3,proto=tcp,port={0},mountport={0},nolock {1}:{2} /mnt/{3}",
                node.port(),
                node.ip(),
                node.export(),
                node.name()
            );
            println!("    libnfs: nfs-cat '{}'", node.url(IMAGE));
        }
        for node in self.site.nodes() {
            common::stop_requested()?;
            let (bytes, client) = read_through(node)?;
            compare_bytes(&golden, &bytes)
                .with_context(|| format!("{IMAGE} read through {}", node.name()))?;
            println!(
                "read {IMAGE} through {} with {client}: {} bytes, the same as the origin's",
                node.name(),
                bytes.len()
            );
        }
        for p in self.site.proxies() {
            let control = p.control_path();
            println!(
                "\n$ gvfsctl --control {} stats      # {}, metrics at http://{}/metrics",
                control.display(),
                p.name(),
                self.metrics[p.name()]
            );
            let out = gvfsctl(control, &["stats"])?;
            ensure!(
                out.status.success(),
                "gvfsctl stats of {}: {}",
                p.name(),
                out.stderr_text()
            );
            print!("{}", indent(&out.stdout_text()));
        }
        println!("\n{}", self.story()?);
        Ok(())
    }

    /// What the counters say about the image's way through the site.
    fn story(&self) -> Result<String> {
        let (server, lan) = (self.site.image_server().stats()?, self.site.lan()?.stats()?);
        let mib = |n: u64| n as f64 / (1 << 20) as f64;
        let mut s = String::from("What crossed each hop:\n");
        writeln!(
            s,
            "  image-server -> lan-proxy: {} FETCHes, {:.2} MiB of file as {:.2} MiB (zstd, each \
             repeated block once, zero chunks not at all)",
            server.ext.fetch_calls,
            mib(server.ext.raw_bytes),
            mib(server.ext.wire_bytes),
        )?;
        writeln!(
            s,
            "  lan-proxy -> nodes: the image fetched {} time(s) for both nodes ({} of its chunks \
             all zeros); {} of the nodes' FETCHes answered from its file cache, in the frames \
             they came in",
            lan.file_cache.counts.files_fetched,
            lan.file_cache.counts.zero_chunks,
            lan.ext.from_file_cache,
        )?;
        for node in self.site.nodes() {
            let v = node.stats()?;
            writeln!(
                s,
                "  {} -> its client: {:.2} MiB read, {} READs answered from the image held whole \
                 in its file cache",
                node.name(),
                mib(v.status.front.read_bytes),
                v.meta.copy_reads,
            )?;
        }
        Ok(s)
    }

    /// Stops every proxy, top first (nodes, then what they read through),
    /// each with SIGTERM; fails if one did not exit 0.
    fn stop(&mut self) -> Result<()> {
        let mut failed = Vec::new();
        for p in self.site.proxies_top_first_mut() {
            if p.pid().is_none() {
                continue;
            }
            let name = p.name().to_owned();
            match p.proxy_mut().terminate() {
                Ok(status) if status.success() => println!("{name}: stopped ({status})"),
                Ok(status) => {
                    println!("{name}: stopped ({status})");
                    failed.push(format!("{name} exited with {status}: {}", p.output()));
                }
                Err(e) => failed.push(format!("{name}: {e:#}")),
            }
        }
        ensure!(failed.is_empty(), "{}", failed.join("\n"));
        Ok(())
    }
}

/// A proxy with a small block cache (and file cache) in a fresh
/// directory, answering attributes from replies up to a minute old (golden
/// images do not change), as examples/deploy/'s LAN proxy and node do.
fn cached() -> Tier {
    Tier::new()
        .cache("64M")
        .args(|a| a.file_cache_size("256M").attr_timeout(60))
}

/// The golden image: its fifth MiB all zeros (a chunk never sent); else
/// 64 KiB regions, one in four all zeros, in the others every fifth 4 KiB
/// block the same shared block (repeated blocks, sent once), the rest half
/// data, half text (about 2:1 under zstd, like guest memory).
fn golden_image() -> Vec<u8> {
    const REGION: usize = 64 << 10;
    const ZERO_CHUNK: usize = 4;
    let shared: Vec<u8> = b"a block every VM of this image holds: kernel text, libc. "
        .iter()
        .copied()
        .cycle()
        .take(BLOCK)
        .collect();
    let mut image = vec![0u8; IMAGE_SIZE];
    for (i, block) in image.chunks_mut(BLOCK).enumerate() {
        let at = i * BLOCK;
        if at >> 20 == ZERO_CHUNK || (at / REGION) % 4 == 3 {
            continue;
        }
        if (at % REGION / BLOCK).is_multiple_of(5) {
            block.copy_from_slice(&shared);
            continue;
        }
        let half = BLOCK / 2;
        gvfs_testbed::data::fill_at(7, at as u64, &mut block[..half]);
        for (j, b) in block[half..].iter_mut().enumerate() {
            *b = b"page cache of a guest. "[j % 23];
        }
    }
    image
}

/// Reads [`IMAGE`] whole through `node`: with libnfs' `nfs-cat` when it
/// is installed, else with gvfs' own NFS client (as this user).
fn read_through(node: &Proxy) -> Result<(Vec<u8>, &'static str)> {
    if gvfs_testbed::fuse::which("nfs-cat").is_some() {
        return Ok((
            gvfs_testbed::libnfs::nfs_cat(&node.url(IMAGE))?,
            "nfs-cat (libnfs)",
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let bytes = rt.block_on(read_with_gvfs_client(node))?;
    Ok((
        bytes,
        "gvfs' NFS client (apt-get install libnfs-utils for nfs-cat)",
    ))
}

async fn read_with_gvfs_client(node: &Proxy) -> Result<Vec<u8>> {
    use gvfs_nfs::nfs3_types::nfs3::{Nfs3Result, READ3args};
    use gvfs_nfs::{Credentials, NfsReply, NfsRequest};
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let cred = Credentials::unix(uid, gid);
    let (a, give_up) = (node.addr(), Duration::from_secs(60));
    let client =
        gvfs_testbed::nfsclient::NfsClient::mount(a, a, node.export(), cred, give_up).await?;
    let file = client
        .resolve(IMAGE)
        .await?
        .with_context(|| format!("{IMAGE} not found through the node"))?;
    let mut bytes = Vec::new();
    loop {
        let reply = client
            .call(NfsRequest::Read(READ3args {
                file: file.clone(),
                offset: bytes.len() as u64,
                count: 1 << 20,
            }))
            .await?;
        let NfsReply::Read(Nfs3Result::Ok(ok)) = reply else {
            bail!("READ at {}: {:?}", bytes.len(), reply.status());
        };
        bytes.extend_from_slice(&ok.data);
        if ok.eof || ok.data.is_empty() {
            return Ok(bytes);
        }
        ensure!(
            bytes.len() <= IMAGE_SIZE,
            "the node sent more than {IMAGE_SIZE} bytes"
        );
    }
}

/// A free port of 127.0.0.1 (bound, then let go).
fn free_port() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// `words` as one shell line: the ones with characters a shell reads
/// quoted.
fn shell_words(words: &[String]) -> String {
    words
        .iter()
        .map(|w| {
            if w.chars().any(|c| "?&*;|<>()$`\"' ".contains(c)) {
                format!("'{w}'")
            } else {
                w.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` with every line indented by four spaces.
fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}
