//! gvfsctl: control a running gvfs-proxy over its control socket, make
//! the certificates for TLS between proxies (`gvfsctl ca`), and make and
//! show metadata files (`gvfsctl meta`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use gvfs_proxy::status::{Stats, Status};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(
    name = "gvfsctl",
    version,
    about = "Control a running gvfs-proxy (status, stats, writeback, flush); make a site CA and \
node certificates (ca); make and show metadata files (meta)",
    after_help = "Without --control, gvfsctl uses the only gvfs-proxy control socket in \
$XDG_RUNTIME_DIR (or /tmp); with several proxies running, name one with --control. \
`ca` and `meta` work on local files and need no proxy."
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
}

#[derive(Debug, Subcommand)]
enum MetaCmd {
    /// Scan files and write `.NAME.gvfsmeta` beside each (on the image
    /// server's directory, or through a proxy's mount).
    Gen {
        /// Regular files to scan; directories and metadata files are skipped.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Zero-map block size: a power of two from 4K to 1M.
        #[arg(long, default_value = "4K", value_name = "SIZE")]
        block_size: String,
        /// Mark the files compress-and-copy (fetched whole as one zstd
        /// stream into the proxy's file cache), and record their zstd size
        /// and the blocks that repeat earlier ones (sent once, not twice).
        #[arg(long)]
        compress: bool,
        /// With --compress, do not record repeated blocks: the file stays
        /// in metadata format 1, which proxies older than repeats read.
        #[arg(long, requires = "compress")]
        no_repeats: bool,
    },
    /// Print a metadata file and whether it still matches its file.
    Show {
        /// The file, or its `.NAME.gvfsmeta`.
        path: PathBuf,
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
    let list = |paths: &[PathBuf]| {
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match found.live.as_slice() {
        [one] => Ok(one.clone()),
        [] if !found.stale.is_empty() => bail!(
            "no running gvfs-proxy found (stale control sockets: {}; a proxy started on the same \
             address replaces its socket) (start one, or pass --control PATH)",
            list(&found.stale)
        ),
        [] => bail!(
            "no running gvfs-proxy found in {} (start one, or pass --control PATH)",
            gvfs_proxy::config::runtime_dir().display()
        ),
        many => bail!(
            "several proxies are running; pick one with --control: {}",
            list(many)
        ),
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    // `gvfsctl ca` works on files only: no control socket to look for.
    let cmd = match cli.cmd {
        Cmd::Ca { cmd } => return ca(cmd),
        Cmd::Meta { cmd } => return meta(cmd),
        cmd => cmd,
    };
    let path = control_path(cli.control)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let ask = |cmd: &str| {
        runtime
            .block_on(gvfs_proxy::control::request(&path, &json!({ "cmd": cmd })))
            .map_err(anyhow::Error::msg)
    };
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
        Cmd::Ca { .. } => unreachable!("gvfsctl ca is handled before the control socket lookup"),
        Cmd::Meta { .. } => {
            unreachable!("gvfsctl meta is handled before the control socket lookup")
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

/// `gvfsctl meta gen|show`: makes and prints metadata files.
fn meta(cmd: MetaCmd) -> anyhow::Result<()> {
    match cmd {
        MetaCmd::Gen {
            paths,
            block_size,
            compress,
            no_repeats,
        } => meta_gen(&paths, &block_size, compress, !no_repeats),
        MetaCmd::Show { path } => meta_show(&path),
    }
}

fn meta_gen(
    paths: &[PathBuf],
    block_size: &str,
    compress: bool,
    repeats: bool,
) -> anyhow::Result<()> {
    let bs = gvfs_proxy::config::parse_size(block_size)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| {
            n.is_power_of_two()
                && (gvfs_meta::MIN_BLOCK_SIZE..=gvfs_meta::MAX_BLOCK_SIZE).contains(n)
        })
        .with_context(|| {
            format!("--block-size {block_size:?}: expected a power of two from 4K to 1M")
        })?;
    let actions = if compress {
        gvfs_meta::Actions::COMPRESS_AND_COPY
    } else {
        gvfs_meta::Actions::default()
    };
    // Pick the files first, so the progress bar knows the total.
    let files = files_to_scan(paths)?;
    let work = |size| gvfs_meta::scan_work(size, actions, repeats);
    let bar = indicatif::ProgressBar::new(files.iter().map(|f| work(f.1)).sum());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let mut done = 0;
    let mut lines = Vec::new();
    for (path, size) in files {
        bar.set_message(path.display().to_string());
        let scanned = gvfs_meta::scan(path, bs, actions, repeats, &mut |n| {
            bar.set_position(done + n)
        })
        .with_context(|| format!("scanning {}", path.display()))?;
        let written = gvfs_meta::write_beside(path, &scanned)
            .with_context(|| format!("writing the metadata of {}", path.display()))?;
        if let Err(why) = trusted_beside(path, &written) {
            let _ = std::fs::remove_file(&written);
            bail!(
                "{}: proxies would not trust metadata written by this user ({why}); \
                 run `gvfsctl meta gen` as root or as the file's owner",
                path.display()
            );
        }
        done += work(size);
        bar.set_position(done);
        let mut line = format!(
            "{}: {}, {}",
            path.display(),
            indicatif::HumanBytes(scanned.file_size),
            zero_summary(&scanned)
        );
        if compress {
            line += &format!(
                ", {} repeat earlier blocks, zstd {}",
                indicatif::HumanBytes(scanned.repeat_bytes()),
                indicatif::HumanBytes(scanned.compressed_size)
            );
        }
        line += &format!(" -> {}", written.display());
        lines.push(line);
    }
    bar.finish_and_clear();
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

/// Whether proxies trust the metadata file `meta` about `file`, by the
/// rule in `gvfs_meta::trust`, judged from the local attributes.
fn trusted_beside(file: &Path, meta: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let own = |p: &Path| -> anyhow::Result<gvfs_meta::trust::Ownership> {
        let m = std::fs::symlink_metadata(p).with_context(|| format!("{}", p.display()))?;
        Ok(gvfs_meta::trust::Ownership {
            regular: m.is_file(),
            uid: m.uid(),
            gid: m.gid(),
            mode: m.mode(),
        })
    };
    gvfs_meta::trust::check(&own(meta)?, &own(file)?)?;
    Ok(())
}

/// The regular files among `paths`, with their sizes; directories and
/// metadata files are skipped with a note, and it is an error if that
/// leaves nothing to scan.
fn files_to_scan(paths: &[PathBuf]) -> anyhow::Result<Vec<(&PathBuf, u64)>> {
    let mut files = Vec::new();
    for path in paths {
        let md = std::fs::symlink_metadata(path).with_context(|| format!("{}", path.display()))?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if gvfs_meta::is_meta_name(name) || name.ends_with(gvfs_meta::META_SUFFIX) {
            eprintln!("gvfsctl: skipping {}: a metadata file", path.display());
        } else if !md.is_file() {
            eprintln!("gvfsctl: skipping {}: not a regular file", path.display());
        } else if gvfs_meta::meta_name(name).is_none() {
            bail!(
                "{}: the name cannot have a metadata file (not UTF-8, or too long)",
                path.display()
            );
        } else {
            files.push((path, md.len()));
        }
    }
    if files.is_empty() {
        bail!(
            "no regular files to scan among {}; directories and metadata files are not \
             scanned (for the files in a directory, pass DIR/*)",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(files)
}

fn zero_summary(m: &gvfs_meta::MetaFile) -> String {
    let (zero, blocks) = (m.zero.zero_blocks(), m.zero.blocks());
    let pct = if blocks == 0 {
        0.0
    } else {
        zero as f64 * 100.0 / blocks as f64
    };
    format!(
        "{zero}/{blocks} zero {} blocks ({pct:.1}%)",
        indicatif::HumanBytes(u64::from(m.block_size))
    )
}

/// The file `path` names and its metadata file, given either; an error
/// that says which is missing when the metadata file is not there.
fn meta_paths(path: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: no UTF-8 file name", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new(""));
    let (file, meta_path, meta) = match gvfs_meta::described_name(name) {
        Some(described) => (dir.join(described), path.to_path_buf(), name.to_string()),
        None => {
            let m = gvfs_meta::meta_name(name)
                .with_context(|| format!("{}: cannot have a metadata file", path.display()))?;
            (path.to_path_buf(), dir.join(&m), m)
        }
    };
    if std::fs::symlink_metadata(&meta_path).is_err() {
        if std::fs::symlink_metadata(&file).is_err() {
            bail!("{}: no such file", path.display());
        }
        bail!(
            "no metadata file {meta} beside {} (make one with `gvfsctl meta gen {}`)",
            file.display(),
            file.display()
        );
    }
    Ok((file, meta_path))
}

fn meta_show(path: &Path) -> anyhow::Result<()> {
    let (file, meta_path) = meta_paths(path)?;
    let len = std::fs::metadata(&meta_path)
        .with_context(|| format!("{}", meta_path.display()))?
        .len();
    if len > gvfs_meta::MAX_META_LEN as u64 {
        bail!(
            "{}: {len} bytes, over the {} byte limit for metadata files",
            meta_path.display(),
            gvfs_meta::MAX_META_LEN
        );
    }
    let bytes = std::fs::read(&meta_path).with_context(|| format!("{}", meta_path.display()))?;
    let m =
        gvfs_meta::MetaFile::decode(&bytes).with_context(|| format!("{}", meta_path.display()))?;
    let a = m.actions;
    let actions: Vec<&str> = [
        (a.compress, "compress"),
        (a.remote_copy, "remote-copy"),
        (a.uncompress, "uncompress"),
        (a.read_locally, "read-locally"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, name)| *name)
    .collect();
    let time = |(s, ns): (u64, u32)| format!("{s}.{ns:09}");
    println!(
        "metadata:        {} ({} bytes)",
        meta_path.display(),
        bytes.len()
    );
    println!("file:            {}", file.display());
    println!(
        "size:            {} ({} bytes)",
        indicatif::HumanBytes(m.file_size),
        m.file_size
    );
    println!("mtime:           {}", time(m.mtime));
    println!("ctime:           {}", time(m.ctime));
    println!(
        "block size:      {}",
        indicatif::HumanBytes(u64::from(m.block_size))
    );
    println!("zero blocks:     {}", zero_summary(&m));
    println!("zero runs:       {}", m.zero.zero_ranges().len());
    println!(
        "repeated blocks: {} in {} runs (sent once by a whole-file fetch)",
        indicatif::HumanBytes(m.repeat_bytes()),
        m.repeats.len()
    );
    println!(
        "actions:         {}",
        if actions.is_empty() {
            "none (zero map only)".to_string()
        } else {
            actions.join(", ")
        }
    );
    if m.compressed_size != 0 {
        println!(
            "zstd size:       {} ({:.1}% of the file)",
            indicatif::HumanBytes(m.compressed_size),
            m.compressed_size as f64 * 100.0 / m.file_size.max(1) as f64
        );
    }
    let state = match std::fs::metadata(&file) {
        Err(e) => format!("cannot check: {e}"),
        Ok(f) => {
            use std::os::unix::fs::MetadataExt;
            let t = |s: i64, ns: i64| {
                (
                    u64::try_from(s).unwrap_or(0),
                    ns.clamp(0, 999_999_999) as u32,
                )
            };
            let (mtime, ctime) = (t(f.mtime(), f.mtime_nsec()), t(f.ctime(), f.ctime_nsec()));
            if !m.matches(f.len(), mtime, ctime, false) {
                format!(
                    "no: stale, the file is now {} bytes, mtime {} (a proxy ignores this \
                     metadata; regenerate it with `gvfsctl meta gen`)",
                    f.len(),
                    time(mtime)
                )
            } else if m.matches(f.len(), mtime, ctime, true) {
                "yes (size, mtime and ctime)".to_string()
            } else {
                format!(
                    "no: the file's ctime is now {} (changed, or its owner or mode were, with \
                     the mtime kept): a proxy ignores this metadata; regenerate it with \
                     `gvfsctl meta gen`",
                    time(ctime)
                )
            }
        }
    };
    println!("matches file:    {state}");
    let trusted = match trusted_beside(&file, &meta_path) {
        Ok(()) => "yes (written by root or the file's owner, no other writers)".to_string(),
        Err(why) => format!("no: {why:#} (a proxy ignores this metadata)"),
    };
    println!("trusted:         {trusted}");
    Ok(())
}

/// Polls the proxy's write-back job with a progress bar until the job that
/// `started` describes has ended; fails when it failed.
fn wait_for_job(
    ask: &dyn Fn(&str) -> anyhow::Result<Value>,
    started: &Value,
) -> anyhow::Result<()> {
    // The job we wait for is the one running now (ours, or one already
    // running that we joined): it ends when `finished` passes this count.
    let finished_before = started["job"]["finished"].as_u64().unwrap_or(0);
    let bar = indicatif::ProgressBar::new(started["job"]["total_bytes"].as_u64().unwrap_or(0));
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(
        started["job"]["kind"]
            .as_str()
            .unwrap_or("write-back")
            .to_string(),
    );
    let job = loop {
        let job = ask("stats")?["writeback"].clone();
        bar.set_length(job["total_bytes"].as_u64().unwrap_or(0));
        bar.set_position(job["done_bytes"].as_u64().unwrap_or(0));
        if job["finished"].as_u64().unwrap_or(0) > finished_before {
            break job;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    bar.finish_and_clear();
    let last = &job["last"];
    let name = last["job"].as_str().unwrap_or("write-back");
    if last["ok"] == true {
        let r = &last["report"];
        let n = |k: &str| r[k].as_u64().unwrap_or(0);
        println!(
            "{name} done: {} bytes in {} blocks of {} files written back ({} rewritten after the server's verifier changed)",
            n("bytes"),
            n("blocks"),
            n("files"),
            n("rewrites"),
        );
        Ok(())
    } else {
        bail!(
            "{name} failed: {} (dirty data stays in the cache)",
            last["error"].as_str().unwrap_or("unknown error")
        )
    }
}

/// What a stats or status answer that does not parse means.
const NOT_UNDERSTOOD: &str =
    "the proxy's answer is not understood (a gvfs-proxy of another version? --json shows it)";

fn print_stats(s: &Stats) {
    print_cache_stats(s);
    if let Some(m) = &s.meta {
        println!("metadata actions");
        println!(
            "  metadata    {} files with, {} without, {} ignored (bad, stale or \
             {} not trusted)",
            m.meta_found, m.meta_absent, m.meta_rejected, m.meta_untrusted
        );
        println!(
            "  zero maps   {} bytes of zeros answered here, {} READs wholly zeros",
            m.zero_bytes, m.zero_reads
        );
        println!(
            "  file cache  {} READs and {} WRITEs served",
            m.copy_reads, m.copy_writes
        );
    }
    if let Some(f) = &s.file_cache {
        println!("file cache (compress-and-copy)");
        println!(
            "  files       {} fetched ({} whole, {} failed), {} joined a fetch under way",
            f.files_fetched, f.files_complete, f.files_failed, f.coalesced_fetches
        );
        println!(
            "  wire        {} chunks, {} bytes for {} bytes of file; {} zero chunks never fetched; \
             {} bytes copied from earlier ones (repeats)",
            f.chunks_fetched, f.wire_bytes, f.raw_bytes, f.zero_chunks, f.repeat_bytes
        );
        println!(
            "  time        {:.2} s fetching whole files (start to last chunk, summed), {:.2} s decompressing",
            f.fetch_micros as f64 / 1e6,
            f.decompress_micros as f64 / 1e6
        );
        println!(
            "  held        {} bytes; {} files with writes; {} files ({} bytes) written back",
            f.cached_bytes, f.dirty_files, f.written_back_files, f.written_back_bytes
        );
        if f.frames_reused + f.frames_made > 0 {
            println!(
                "  frames      {} chunks sent to other proxies as they came, {} compressed here; {} bytes kept",
                f.frames_reused, f.frames_made, f.frame_bytes
            );
        }
    }
    if let Some(a) = &s.attr_cache {
        println!("attribute cache (--attr-timeout)");
        println!(
            "  calls       {} answered here, {} asked upstream; emptied {} times",
            a.hits, a.misses, a.invalidations
        );
        println!(
            "  listings    {} directories read along with a first LOOKUP",
            a.listings
        );
    }
    let e = &s.ext;
    if e.fetch_calls + e.store_calls > 0 {
        println!("extension program (answering other proxies)");
        println!(
            "  FETCH       {} calls, {} bytes of file sent as {} bytes ({} from the file cache, {} compressed here, {} forwarded)",
            e.fetch_calls,
            e.raw_bytes,
            e.wire_bytes,
            e.from_file_cache,
            e.compressed_here,
            e.forwarded
        );
        println!(
            "  STORE       {} calls, {} bytes received for {} bytes of file; {} errors",
            e.store_calls, e.stored_wire_bytes, e.stored_raw_bytes, e.errors
        );
    }
}

fn print_cache_stats(s: &Stats) {
    let Some(c) = &s.cache else {
        println!("no block cache (the proxy runs without --cache-dir)");
        return;
    };
    let n = &c.counts;
    let (hits, misses) = (n.hits, n.misses);
    let ratio = if hits + misses > 0 {
        100.0 * hits as f64 / (hits + misses) as f64
    } else {
        0.0
    };
    println!("block cache");
    println!(
        "  hits        {hits} ({ratio:.1}%), misses {misses}, read-ahead hits {}",
        n.readahead_hits
    );
    println!(
        "  served      {} bytes from the cache, {} bytes fetched upstream",
        n.hit_bytes, n.fetched_bytes
    );
    println!(
        "  dirty       {} bytes; {} bytes written back so far",
        c.dirty_bytes, n.write_back_bytes
    );
    println!(
        "  cached      {} of {} bytes; {} evictions",
        c.cached_bytes, c.capacity_bytes, c.evictions
    );
    let calls = n.upstream_calls;
    let avg = n.upstream_latency_us_total.checked_div(calls).unwrap_or(0);
    println!(
        "  upstream    {calls} calls, {avg} us average latency; {} misses coalesced",
        n.coalesced_misses
    );
    let (bad, lost) = (c.corrupt_clean_dropped, c.dirty_sub_blocks_lost);
    if bad + lost + c.banks_lost > 0 {
        println!(
            "  integrity   {bad} sub-blocks failed their checksum and were fetched again; \
             {lost} dirty sub-blocks LOST (not written back; see the log and CACHE_DIR/quarantine); \
             {} bank files missing or cut off; write verifier changed {} times",
            c.banks_lost, c.verifier_changes
        );
    }
    let w = &s.writeback;
    if w.running {
        println!(
            "  write-back  running: {} of {} bytes",
            w.done_bytes, w.total_bytes
        );
    }
}

fn print_status(s: &Status) {
    println!("gvfs-proxy {} (pid {})", s.version, s.pid);
    println!("  listening   {}  export {}", s.listen, s.export);
    println!("  upstream    {}", s.upstream);
    println!("  uptime      {} s", s.uptime_secs);
    let c = &s.connections;
    println!(
        "  connections {} open, {} accepted, {} closed for oversized records",
        c.open, c.accepted, c.closed_oversized
    );
    println!(
        "  data        {} bytes read, {} bytes written",
        s.read_bytes, s.write_bytes
    );
    println!(
        "  errors      {} RPC-level, {} upstream; {} retransmissions answered from the duplicate-request cache",
        s.rpc_errors, s.service_errors, s.drc_hits
    );
    let list: Vec<String> = s
        .nfs_calls
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    println!(
        "  NFS calls   {}",
        if list.is_empty() {
            "none".into()
        } else {
            list.join(", ")
        }
    );
    println!(
        "  MOUNT calls {}  PORTMAP calls {}",
        s.mount_calls, s.portmap_calls
    );
    if let Some(u) = &s.upstream_client {
        println!(
            "  upstream rpc {}: {} calls, {} retransmits, {} connects",
            u.server, u.calls, u.retransmits, u.connects
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_gen_with_nothing_to_scan_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("d");
        std::fs::create_dir(&sub).unwrap();
        let meta = dir.path().join(".disk.img.gvfsmeta");
        std::fs::write(&meta, b"").unwrap();
        let e = format!("{:#}", files_to_scan(&[sub.clone(), meta]).unwrap_err());
        assert!(e.starts_with("no regular files to scan among "), "{e}");
        assert!(e.contains(&sub.display().to_string()), "{e}");
        assert!(e.contains("pass DIR/*"), "{e}");
        let file = dir.path().join("disk.img");
        std::fs::write(&file, b"data").unwrap();
        let given = [sub, file.clone()];
        assert_eq!(files_to_scan(&given).unwrap(), vec![(&file, 4)]);
    }

    #[test]
    fn meta_show_says_which_file_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.img");
        let e = format!("{:#}", meta_paths(&file).unwrap_err());
        assert_eq!(e, format!("{}: no such file", file.display()));
        std::fs::write(&file, b"data").unwrap();
        let e = format!("{:#}", meta_paths(&file).unwrap_err());
        assert!(
            e.starts_with("no metadata file .disk.img.gvfsmeta beside "),
            "{e}"
        );
        assert!(e.contains("(make one with `gvfsctl meta gen "), "{e}");
        let meta = dir.path().join(".disk.img.gvfsmeta");
        let e = format!("{:#}", meta_paths(&meta).unwrap_err());
        assert!(e.starts_with("no metadata file .disk.img.gvfsmeta"), "{e}");
        std::fs::write(&meta, b"").unwrap();
        assert_eq!(meta_paths(&file).unwrap(), (file.clone(), meta.clone()));
        assert_eq!(meta_paths(&meta).unwrap(), (file, meta));
    }
}
