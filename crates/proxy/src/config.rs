//! Proxy configuration: the TOML file format, defaults, and validation.
//!
//! The command line and the file carry the same settings; a value on the
//! command line wins. Validation turns every bad value into one clear line.
//!
//! The settings as written in a TOML file ([`FileConfig`]; every key optional):
//!
//! ```toml
//! listen = "127.0.0.1:2049"
//! upstream = "nfs://filer/srv/images"   # or "dir:/srv/images", "gvfs://peer:20049/export"
//! export = "/export"
//! control = "/run/gvfs/proxy.sock"
//! allow_remote = false
//! upstream_timeout_secs = 0            # 0 (default) = wait forever, like a hard mount
//! connect_timeout_secs = 5
//! max_connections = 256
//! max_pending_connections = 64       # not yet through a first call or TLS handshake
//! max_in_flight = 64
//! idle_timeout_secs = 600              # close a client connection idle this long
//! buffer_memory = "256M"               # call records and replies held, all clients
//! drain_timeout_secs = 10
//! metrics = "127.0.0.1:9100"           # Prometheus text endpoint
//! attr_timeout_secs = 0                # attribute cache (0, default = off)
//!
//! # block cache (off unless cache_dir is set)
//! cache_dir = "/var/cache/gvfs/proxy1"
//! cache_size = "4G"
//! cache_banks = 16
//! cache_ways = 16
//! block_size = "64K"
//! write_policy = "write-back"          # or "write-through"
//! readahead_blocks = 32
//! writeback_on_exit = true
//! exit_writeback_timeout_secs = 60
//! meta = true                          # metadata actions (default: on with a cache or listen_tls)
//! file_cache_size = "16G"              # whole files fetched by compress-and-copy
//! dedup = true                         # copy blocks shared with held images
//! learn_window_secs = 20               # a lazy clone's working set, learned this long
//!
//! # TLS between proxies (certificates from `gvfsctl ca init` / `ca issue`)
//! listen_tls = "0.0.0.0:20049"         # accept gvfs:// peers here
//! cert = "/etc/gvfs/node1.pem"
//! key = "/etc/gvfs/node1-key.pem"
//! ca = "/etc/gvfs/ca.pem"
//! handshake_timeout_secs = 10
//! unknown_peers = "squash"             # peers with no rule below
//! nobody = [65534, 65534]              # uid, gid of squashed calls
//! [peers]                              # certificate name = mapping
//! site-a = "fixed:1000:1000"           # every call as uid 1000, gid 1000
//! site-b = "range:20000-29999"         # caller's uid/gid if inside, else nobody
//! lan-proxy = "pass"                   # caller's credentials unchanged
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gvfs_upstream::{DEFAULT_EXPORT, UpstreamUrl};

use crate::server::ServerLimits;

mod error;
mod file;
pub use error::ConfigError;
pub use file::{CacheSection, FileConfig, MetaSection, ServerSection, TlsSection};

/// The default listening address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:2049";
/// [`DEFAULT_LISTEN`] as an address.
pub const DEFAULT_LISTEN_ADDR: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    2049,
));
/// `--listen none`: no NFS listener (a FUSE mount, or TLS peers, only).
pub const NO_LISTENER: &str = "none";
/// The directory served when no upstream is configured (created with sample
/// files on first use).
pub const SAMPLE_DIR: &str = "gvfs-sample";

/// Where the upstream comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamChoice {
    /// Configured explicitly.
    Url(UpstreamUrl),
    /// Nothing configured: serve the sample directory.
    Sample(PathBuf),
}

/// A validated proxy configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on for NFS clients; `None` (`--listen none`) for
    /// none.
    pub listen: Option<SocketAddr>,
    /// What to serve.
    pub upstream: UpstreamChoice,
    /// The export path clients mount (starts with `/`).
    pub export: String,
    /// Control socket path; `None` picks one from the bound address.
    pub control: Option<PathBuf>,
    /// Give up on an upstream call after this long; `None` waits forever.
    pub upstream_timeout: Option<Duration>,
    /// One upstream connection attempt.
    pub connect_timeout: Duration,
    /// Limits of the listening side.
    pub limits: ServerLimits,
    /// How long SIGTERM waits for calls in flight.
    pub drain_timeout: Duration,
    /// The block cache, when configured.
    pub cache: Option<CacheSettings>,
    /// Where to serve Prometheus metrics, when configured.
    pub metrics: Option<SocketAddr>,
    /// TLS: this node's certificate and how peers are mapped, when set.
    pub tls: Option<TlsSettings>,
    /// Metadata actions on (default: when there is a block cache).
    pub meta: bool,
    /// The attribute cache's timeout; `None` leaves it off.
    pub attr_timeout: Option<Duration>,
    /// Where to mount the export through FUSE, if anywhere.
    pub mount: Option<PathBuf>,
    /// The mount's read-ahead in bytes.
    pub mount_readahead: u32,
    /// Where the mount writes its read trace, if anywhere.
    pub mount_trace: Option<PathBuf>,
    /// Whether the mount's FUSE connection outlives the process.
    pub mount_keep: bool,
    /// The mount's connection, passed back by systemd from its file
    /// descriptor store at start (read by `main` before anything else);
    /// never from a file or the command line.
    pub mount_stored: Option<gvfs_fuse::fdstore::StoredFd>,
}

/// Validated TLS settings.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// Certificate, key and CA files.
    pub files: gvfs_tunnel::TlsFiles,
    /// Where to accept gvfs:// peers, if anywhere.
    pub listen: Option<SocketAddr>,
    /// Identity mapping of peers.
    pub map: gvfs_tunnel::IdentityMap,
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
}

fn tls_settings(f: &FileConfig) -> Result<Option<TlsSettings>, ConfigError> {
    let files = match (&f.tls.cert, &f.tls.key, &f.tls.ca) {
        (Some(cert), Some(key), Some(ca)) => gvfs_tunnel::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            ca: ca.clone(),
        },
        (None, None, None) => {
            let needs = if f.tls.listen_tls.is_some() {
                Some("--listen-tls")
            } else if f
                .server
                .upstream
                .as_deref()
                .is_some_and(|u| u.starts_with("gvfs://"))
            {
                Some("a gvfs:// upstream")
            } else {
                None
            };
            if let Some(what) = needs {
                return Err(ConfigError::Invalid(format!(
                    "{what} needs --cert, --key and --ca (make them with `gvfsctl ca init` and `gvfsctl ca issue`)"
                )));
            }
            refuse_orphans(
                &[
                    ("--map-peer", "[peers]", f.tls.peers.is_some()),
                    (
                        "--unknown-peers",
                        "unknown_peers",
                        f.tls.unknown_peers.is_some(),
                    ),
                    (
                        "--handshake-timeout",
                        "handshake_timeout_secs",
                        f.tls.handshake_timeout_secs.is_some(),
                    ),
                    ("", "nobody", f.tls.nobody.is_some()),
                ],
                "there is no TLS: add --cert, --key and --ca (cert, key and ca in the file)",
            )?;
            return Ok(None);
        }
        _ => {
            return Err(ConfigError::Invalid(
                "--cert, --key and --ca go together: give all three".into(),
            ));
        }
    };
    let listen = match &f.tls.listen_tls {
        Some(l) => Some(l.parse::<SocketAddr>().map_err(|_| {
            ConfigError::Invalid(format!(
                "bad TLS listen address {l:?}: expected IP:PORT, e.g. 0.0.0.0:20049"
            ))
        })?),
        None => None,
    };
    let mut map = gvfs_tunnel::IdentityMap::default();
    for (name, m) in f.tls.peers.iter().flatten() {
        let mapping = m
            .parse()
            .map_err(|e| ConfigError::Invalid(format!("bad mapping for peer {name:?}: {e}")))?;
        map.peers.insert(name.clone(), mapping);
    }
    if let Some(u) = &f.tls.unknown_peers {
        map.unknown = u
            .parse()
            .map_err(|e| ConfigError::Invalid(format!("bad unknown_peers mapping: {e}")))?;
    }
    if let Some(n) = f.tls.nobody {
        map.nobody = n;
    }
    let handshake_timeout = match f.tls.handshake_timeout_secs {
        Some(0) => {
            return Err(ConfigError::Invalid(
                "handshake_timeout_secs must be at least 1".into(),
            ));
        }
        Some(s) => Duration::from_secs(s),
        None => Duration::from_secs(10),
    };
    Ok(Some(TlsSettings {
        files,
        listen,
        map,
        handshake_timeout,
    }))
}

/// A validated block cache configuration.
#[derive(Debug, Clone)]
pub struct CacheSettings {
    /// Where the bank files live.
    pub dir: PathBuf,
    /// Capacity and layout.
    pub geometry: gvfs_cache::Geometry,
    /// Write policy and read-ahead.
    pub layer: gvfs_cache::CacheConfig,
    /// Write dirty data back on SIGTERM/SIGINT.
    pub writeback_on_exit: bool,
    /// Longest write-back on exit.
    pub exit_writeback_timeout: Duration,
    /// Most bytes of whole files the file cache (in `dir/files`) holds.
    pub file_cache_size: u64,
    /// Copy blocks shared with held images instead of fetching them.
    pub dedup: bool,
    /// How long a working set is learned after its first touch.
    pub learn_window: Duration,
}

/// The smallest memory budget for call records and replies: two of the
/// largest calls, rounded up.
const MIN_BUFFER_MEMORY: u64 = 4 << 20;

/// The file cache's budget when none is configured.
pub const DEFAULT_FILE_CACHE_SIZE: u64 = 16 << 30;

/// Parses a size such as `4G`, `512M`, `64K`, `64KiB` or `1048576`.
pub fn parse_size(s: &str) -> Result<u64, ConfigError> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => u32::MAX,
    };
    num.parse::<u64>()
        .ok()
        .filter(|_| shift != u32::MAX)
        .and_then(|n| n.checked_mul(1u64 << shift.min(40)))
        .ok_or_else(|| {
            ConfigError::Invalid(format!(
                "bad size {s:?}: expected e.g. 4G, 512M, 64K or bytes"
            ))
        })
}

/// Refuses the first setting of `settings` (flag, file key, whether set)
/// that is set although what it tunes is off, rather than ignore it:
/// "FLAG (KEY in the file) is set but {off}".
fn refuse_orphans(settings: &[(&str, &str, bool)], off: &str) -> Result<(), ConfigError> {
    match settings.iter().find(|(_, _, set)| *set) {
        Some(("", key, _)) => Err(ConfigError::Invalid(format!(
            "{key} in the file is set but {off}"
        ))),
        Some((flag, key, _)) => Err(ConfigError::Invalid(format!(
            "{flag} ({key} in the file) is set but {off}"
        ))),
        None => Ok(()),
    }
}

fn cache_settings(f: &FileConfig) -> Result<Option<CacheSettings>, ConfigError> {
    let Some(dir) = f.cache.cache_dir.clone() else {
        refuse_orphans(
            &[
                ("--cache-size", "cache_size", f.cache.cache_size.is_some()),
                (
                    "--cache-banks",
                    "cache_banks",
                    f.cache.cache_banks.is_some(),
                ),
                ("--cache-ways", "cache_ways", f.cache.cache_ways.is_some()),
                ("--block-size", "block_size", f.cache.block_size.is_some()),
                (
                    "--write-policy",
                    "write_policy",
                    f.cache.write_policy.is_some(),
                ),
                (
                    "--file-cache-size",
                    "file_cache_size",
                    f.meta.file_cache_size.is_some(),
                ),
                ("--dedup/--no-dedup", "dedup", f.meta.dedup.is_some()),
                (
                    "--learn-window",
                    "learn_window_secs",
                    f.meta.learn_window_secs.is_some(),
                ),
                (
                    "--readahead",
                    "readahead_blocks",
                    f.cache.readahead_blocks.is_some(),
                ),
                (
                    "--no-writeback-on-exit",
                    "writeback_on_exit",
                    f.cache.writeback_on_exit.is_some(),
                ),
                (
                    "--exit-writeback-timeout",
                    "exit_writeback_timeout_secs",
                    f.cache.exit_writeback_timeout_secs.is_some(),
                ),
            ],
            "there is no cache: add --cache-dir DIR (cache_dir in the file)",
        )?;
        return Ok(None);
    };
    let defaults = gvfs_cache::GeometryConfig::default();
    let block = match &f.cache.block_size {
        Some(b) => u32::try_from(parse_size(b)?)
            .map_err(|_| ConfigError::Invalid(format!("block size {b} is too large")))?,
        None => defaults.block_size,
    };
    let geometry = gvfs_cache::GeometryConfig {
        capacity: match &f.cache.cache_size {
            Some(c) => parse_size(c)?,
            None => defaults.capacity,
        },
        banks: f.cache.cache_banks.unwrap_or(defaults.banks),
        ways: f.cache.cache_ways.unwrap_or(defaults.ways),
        block_size: block,
        sub_block_size: defaults.sub_block_size.min(block),
    };
    let geometry = gvfs_cache::Geometry::new(geometry)
        .map_err(|e| ConfigError::Invalid(format!("bad cache geometry: {e}")))?;
    let policy = match &f.cache.write_policy {
        Some(p) => p.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "bad write policy {p:?}: expected write-back or write-through"
            ))
        })?,
        None => gvfs_cache::WritePolicy::WriteBack,
    };
    Ok(Some(CacheSettings {
        dir,
        geometry,
        layer: gvfs_cache::CacheConfig {
            policy,
            readahead_blocks: f
                .cache
                .readahead_blocks
                .unwrap_or(gvfs_cache::CacheConfig::default().readahead_blocks),
        },
        writeback_on_exit: f.cache.writeback_on_exit.unwrap_or(true),
        exit_writeback_timeout: Duration::from_secs(
            f.cache.exit_writeback_timeout_secs.unwrap_or(60),
        ),
        file_cache_size: match &f.meta.file_cache_size {
            Some(s) => parse_size(s)?,
            None => DEFAULT_FILE_CACHE_SIZE,
        },
        dedup: f.meta.dedup.unwrap_or(true),
        learn_window: learn_window(f)?,
    }))
}

/// `--learn-window`, from 1 s to [`gvfs_filecache::LEARN_MAX`].
fn learn_window(f: &FileConfig) -> Result<Duration, ConfigError> {
    let max = gvfs_filecache::LEARN_MAX.as_secs();
    match f.meta.learn_window_secs {
        None => Ok(gvfs_filecache::DEFAULT_LEARN_WINDOW),
        Some(s) if (1..=max).contains(&s) => Ok(Duration::from_secs(s)),
        Some(s) => Err(ConfigError::Invalid(format!(
            "--learn-window {s} (learn_window_secs in the file): from 1 to {max} seconds"
        ))),
    }
}

/// The largest `--mount-readahead`.
const MAX_MOUNT_READAHEAD: u64 = 64 << 20;

fn mount_readahead(f: &FileConfig) -> Result<u32, ConfigError> {
    let Some(s) = &f.server.mount_readahead else {
        return Ok(gvfs_fuse::DEFAULT_READ_AHEAD);
    };
    if f.server.mount.is_none() {
        return Err(ConfigError::Invalid(
            "--mount-readahead (mount_readahead) needs --mount (mount)".into(),
        ));
    }
    let n = parse_size(s)?;
    if n > MAX_MOUNT_READAHEAD {
        return Err(ConfigError::Invalid(format!(
            "--mount-readahead {s}: at most {MAX_MOUNT_READAHEAD} bytes"
        )));
    }
    Ok(n as u32)
}

impl Config {
    /// Validates `f`, filling in defaults.
    pub fn from_file_config(f: FileConfig) -> Result<Self, ConfigError> {
        let cache = cache_settings(&f)?;
        let tls = tls_settings(&f)?;
        let mount_readahead = mount_readahead(&f)?;
        let mount_keep = match f.server.mount_keep.as_deref() {
            None | Some("auto") => true,
            Some("none") => false,
            Some(other) => {
                return Err(ConfigError::Invalid(format!(
                    "--mount-keep (mount_keep) is `auto` or `none`, not {other:?}"
                )));
            }
        };
        if f.server.mount_keep.is_some() && f.server.mount.is_none() {
            return Err(ConfigError::Invalid(
                "--mount-keep (mount_keep) needs --mount (mount)".into(),
            ));
        }
        if f.server.mount_trace.is_some() && f.server.mount.is_none() {
            return Err(ConfigError::Invalid(
                "--mount-trace (mount_trace) needs --mount (mount)".into(),
            ));
        }
        let metrics = match &f.server.metrics {
            Some(m) => {
                let addr: SocketAddr = m.parse().map_err(|_| {
                    ConfigError::Invalid(format!("bad metrics address {m:?}: expected IP:PORT"))
                })?;
                if !addr.ip().is_loopback() && !f.server.allow_remote.unwrap_or(false) {
                    return Err(ConfigError::Invalid(format!(
                        "refusing to serve metrics on {addr}: only loopback unless you pass --allow-remote"
                    )));
                }
                Some(addr)
            }
            None => None,
        };
        let listen_s = f
            .server
            .listen
            .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen = if listen_s == NO_LISTENER {
            if f.server.mount.is_none() && f.tls.listen_tls.is_none() {
                return Err(ConfigError::Invalid(
                    "--listen none leaves nothing to serve: give --mount DIR (or --listen-tls)"
                        .into(),
                ));
            }
            None
        } else {
            Some(listen_s.parse::<SocketAddr>().map_err(|_| {
                ConfigError::Invalid(format!(
                    "bad listen address {listen_s:?}: expected IP:PORT, e.g. 127.0.0.1:2049, \
                     or none"
                ))
            })?)
        };
        if let Some(listen) = listen
            && !listen.ip().is_loopback()
            && !f.server.allow_remote.unwrap_or(false)
        {
            return Err(ConfigError::Invalid(format!(
                "refusing to listen on {listen}: plain NFS is unencrypted and unauthenticated, so \
                 it binds only loopback addresses unless you pass --allow-remote"
            )));
        }
        let upstream = match f.server.upstream {
            Some(u) => UpstreamChoice::Url(u.parse()?),
            None => UpstreamChoice::Sample(PathBuf::from(SAMPLE_DIR)),
        };
        let export = f
            .server
            .export
            .unwrap_or_else(|| DEFAULT_EXPORT.to_string());
        if !export.starts_with('/') || export.len() > 1024 || export.contains('\0') {
            return Err(ConfigError::Invalid(format!(
                "bad export {export:?}: must start with / (e.g. /export) and be at most 1024 bytes"
            )));
        }
        let positive = |v: Option<usize>, default: usize, what: &str| match v {
            Some(0) => Err(ConfigError::Invalid(format!("{what} must be at least 1"))),
            Some(n) => Ok(n),
            None => Ok(default),
        };
        let defaults = ServerLimits::default();
        let limits = ServerLimits {
            max_connections: positive(
                f.server.max_connections,
                defaults.max_connections,
                "max_connections",
            )?,
            max_pending: positive(
                f.server.max_pending_connections,
                defaults.max_pending,
                "max_pending_connections",
            )?,
            max_in_flight: positive(
                f.server.max_in_flight,
                defaults.max_in_flight,
                "max_in_flight",
            )?,
            idle_timeout: match f.server.idle_timeout_secs {
                Some(0) => {
                    return Err(ConfigError::Invalid(
                        "idle_timeout_secs must be at least 1".into(),
                    ));
                }
                Some(s) => Duration::from_secs(s),
                None => defaults.idle_timeout,
            },
            buffer_memory: match &f.server.buffer_memory {
                Some(m) => match parse_size(m)? {
                    n if n < MIN_BUFFER_MEMORY => {
                        return Err(ConfigError::Invalid(format!(
                            "buffer memory {m} is too small: at least 4M (two of the largest calls)"
                        )));
                    }
                    n => n,
                },
                None => defaults.buffer_memory,
            },
            ..defaults
        };
        let connect_timeout = match f.server.connect_timeout_secs {
            Some(0) => {
                return Err(ConfigError::Invalid(
                    "connect_timeout_secs must be at least 1".into(),
                ));
            }
            Some(s) => Duration::from_secs(s),
            None => Duration::from_secs(5),
        };
        Ok(Self {
            listen,
            upstream,
            export,
            control: f.server.control,
            // Like a hard mount unless told otherwise: an outage delays
            // clients instead of failing their calls.
            upstream_timeout: match f.server.upstream_timeout_secs {
                Some(0) | None => None,
                Some(s) => Some(Duration::from_secs(s)),
            },
            connect_timeout,
            limits,
            drain_timeout: Duration::from_secs(f.server.drain_timeout_secs.unwrap_or(10)),
            // A proxy that serves other proxies (--listen-tls) reads the
            // metadata for their whole-file fetches (repeated blocks).
            meta: f
                .meta
                .meta
                .unwrap_or(cache.is_some() || tls.as_ref().is_some_and(|t| t.listen.is_some())),
            attr_timeout: match f.server.attr_timeout_secs {
                Some(0) | None => None,
                Some(s) => Some(Duration::from_secs(s)),
            },
            mount: f.server.mount.clone(),
            mount_readahead,
            mount_trace: f.server.mount_trace.clone(),
            mount_keep,
            mount_stored: None,
            cache,
            metrics,
            tls,
        })
    }
}

/// The control socket of a proxy configured by `cfg` that listens for
/// NFS at `nfs` and for TLS peers at `tls`: the configured one, else a
/// default named after the first of those, or after the mount.
pub fn control_path(cfg: &Config, nfs: Option<SocketAddr>, tls: Option<SocketAddr>) -> PathBuf {
    match (&cfg.control, nfs, &cfg.mount) {
        (Some(path), _, _) => path.clone(),
        (None, Some(addr), _) => default_control_path(addr),
        (None, None, Some(dir)) => default_control_path_for_mount(dir),
        (None, None, None) => default_control_path(tls.unwrap_or(DEFAULT_LISTEN_ADDR)),
    }
}

/// The control socket path used when none is configured: one per listening
/// address, in `$XDG_RUNTIME_DIR` (or `/tmp`), so `gvfsctl` can find it.
pub fn default_control_path(listen: SocketAddr) -> PathBuf {
    runtime_dir().join(format!("gvfs-proxy-{}-{}.sock", listen.ip(), listen.port()))
}

/// The control socket path of a proxy with no NFS listener: one per mount
/// point (`/mnt/vm` gives `gvfs-proxy-mnt-vm.sock`), beside the others.
pub fn default_control_path_for_mount(dir: &Path) -> PathBuf {
    runtime_dir().join(format!("gvfs-proxy-{}.sock", mount_name(dir)))
}

/// The state directory of the FUSE session at `dir` when there is no
/// cache directory: `gvfs-mount-NAME/` beside the control sockets, NAME
/// as in [`default_control_path_for_mount`].
pub fn default_state_dir_for_mount(dir: &Path) -> PathBuf {
    runtime_dir().join(format!("gvfs-mount-{}", mount_name(dir)))
}

/// A mount point as one file name: `/mnt/vm` gives `mnt-vm`.
fn mount_name(dir: &Path) -> String {
    dir.to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Where default control sockets live.
pub fn runtime_dir() -> PathBuf {
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

#[cfg(test)]
mod tests;
