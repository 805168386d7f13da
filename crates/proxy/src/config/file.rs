//! The settings as a TOML file and the command line both spell them
//! ([`FileConfig`]), read and merged.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::ConfigError;

// Every setting, spelled once: a TOML key is the field's name, a flag its
// `#[arg(long)]` (the field's name with dashes, unless it says otherwise),
// its help the field's doc. One struct per section of the help; in the file
// the keys of every section sit side by side at the top level. (A doc
// comment on these structs would become the help's header; the file's
// format is in the module doc.)
#[allow(missing_docs)]
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, Serialize, clap::Args)]
pub struct FileConfig {
    #[command(flatten)]
    #[serde(flatten)]
    pub server: ServerSection,
    #[command(flatten)]
    #[serde(flatten)]
    pub cache: CacheSection,
    #[command(flatten)]
    #[serde(flatten)]
    pub tls: TlsSection,
    #[command(flatten)]
    #[serde(flatten)]
    pub meta: MetaSection,
}

// What is served, where, and the limits and timeouts of serving it.
#[allow(missing_docs)]
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, Serialize, clap::Args)]
pub struct ServerSection {
    /// Address to listen on [default: 127.0.0.1:2049]. Plain NFS binds only
    /// loopback addresses unless --allow-remote is given; `none` serves no
    /// NFS clients (with --mount: the FUSE mount only).
    #[arg(long, value_name = "IP:PORT")]
    pub listen: Option<String>,

    /// What to serve: dir:PATH, nfs://HOST[:PORT]/EXPORT[?mountport=N] or
    /// gvfs://HOST:PORT[/EXPORT][?name=NAME] (see UPSTREAM URLS below).
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,

    /// The export path clients mount [default: /export].
    #[arg(long, value_name = "/NAME")]
    pub export: Option<String>,

    /// Control socket for gvfsctl [default: $XDG_RUNTIME_DIR or /tmp,
    /// gvfs-proxy-IP-PORT.sock].
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,

    /// Allow a plain (unencrypted) listener on a non-loopback address.
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub allow_remote: Option<bool>,

    /// Give up on an upstream call after SECS and report an I/O error to the
    /// client; 0 waits forever like a hard mount, so an upstream outage only
    /// delays clients [default: 0].
    #[arg(long = "upstream-timeout", value_name = "SECS")]
    pub upstream_timeout_secs: Option<u64>,

    /// Timeout of one upstream connection attempt [default: 5].
    #[arg(long = "connect-timeout", value_name = "SECS")]
    pub connect_timeout_secs: Option<u64>,

    /// Client connections served at once [default: 256]. When all are
    /// taken, a new client is served by closing the connection idle
    /// longest (one with no call running); if every one is busy, it waits.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,

    /// Connections not yet through their first call (or TLS handshake) at
    /// once, besides --max-connections; one more closes the oldest, so
    /// sockets that send nothing cannot keep clients out [default: 64].
    #[arg(long, value_name = "N")]
    pub max_pending_connections: Option<usize>,

    /// Close a client connection that has nothing running and sends no
    /// call for SECS [default: 600]. A new connection must send its first
    /// call within 10 s, and a call once begun must be complete within 30 s.
    #[arg(long = "idle-timeout", value_name = "SECS")]
    pub idle_timeout_secs: Option<u64>,

    /// Most memory for call records and replies held at once, all client
    /// connections together, e.g. 256M [default: 256M], shared by tenants
    /// (a TLS peer's certificate name, else a connection): a client that
    /// does not read its replies stops being read once its tenant holds its
    /// share (all of it alone, an equal part while others hold some); every
    /// client may still send one call at a time.
    #[arg(long, value_name = "SIZE")]
    pub buffer_memory: Option<String>,

    /// Calls running at once per client connection; calls a reader
    /// waits for (all NFS calls, demand FETCHes) may run up to twice this
    /// [default: 64].
    #[arg(long, value_name = "N")]
    pub max_in_flight: Option<usize>,

    /// On SIGTERM/SIGINT, wait this long for calls in flight [default: 10].
    #[arg(long = "drain-timeout", value_name = "SECS")]
    pub drain_timeout_secs: Option<u64>,

    /// Serve Prometheus metrics (the counters of `gvfsctl status` and
    /// `gvfsctl stats`) at http://ADDR/metrics; loopback only unless
    /// --allow-remote.
    #[arg(long, value_name = "IP:PORT")]
    pub metrics: Option<String>,

    /// Answer GETATTR, LOOKUP, ACCESS, FSINFO, PATHCONF, MNT and NULL
    /// locally from replies at most SECS old, like a client's actimeo: saves
    /// the round trips every client session starts with. A directory's
    /// first LOOKUP also reads it (READDIRPLUS) to answer the names after
    /// it. For read-only images; changes made upstream by others show
    /// within SECS. Calls that change anything through this proxy empty it
    /// [default: 0, off].
    #[arg(long = "attr-timeout", value_name = "SECS")]
    pub attr_timeout_secs: Option<u64>,

    /// Also mount the export at DIR through FUSE, in this process, through
    /// the same layers (no NFS client or root needed; non-root needs
    /// fusermount3). DIR must exist and be empty. Names and attributes are
    /// kept by the kernel for --attr-timeout (1 s when that is off). The
    /// mount outlives the process (--mount-keep): a stop while files are
    /// open, or a crash, is a pause for the processes using it; start the
    /// same command again and it takes the mount over. A stop with nothing
    /// open, or `gvfsctl unmount`, ends the mount.
    #[arg(long, value_name = "DIR", help_heading = "FUSE")]
    pub mount: Option<PathBuf>,

    /// Whether the mount outlives this process: `auto` (a small keeper
    /// process holds the FUSE connection, so a proxy killed, or stopped
    /// while files are open, leaves a mount whose users wait for the next
    /// proxy) or `none` (the mount ends with the process, and so does every
    /// process that maps a file from it) [default: auto].
    #[arg(long, value_name = "auto|none", help_heading = "FUSE")]
    pub mount_keep: Option<String>,

    /// The mount's read-ahead: how much a sequential reader or a page
    /// fault of a mapped file asks for at once. 0 suits a node that maps
    /// VM memory images (lazy clones): a page fault then reads its page,
    /// and the node fetches the 8 KiB piece around it (without a learned
    /// working set, the rest of its 1 MiB chunk behind it) [default: 1M].
    #[arg(long, value_name = "SIZE", help_heading = "FUSE")]
    pub mount_readahead: Option<String>,

    /// Write a line per read the mount answers to PATH (`ino offset size
    /// start_us end_us`, times in microseconds since the Unix epoch), to
    /// replay a guest's page faults elsewhere; at most 4M lines.
    #[arg(long, value_name = "PATH", help_heading = "FUSE")]
    pub mount_trace: Option<PathBuf>,
}

// The block cache (off unless `cache_dir` is set).
#[allow(missing_docs)]
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, Serialize, clap::Args)]
pub struct CacheSection {
    /// Keep a block cache in DIR (bank files); without it the proxy only
    /// forwards. The cache stays warm across restarts.
    #[arg(long, value_name = "DIR", help_heading = "Block cache")]
    pub cache_dir: Option<PathBuf>,

    /// Cache capacity, e.g. 4G, 512M [default: 1G].
    #[arg(long, value_name = "SIZE", help_heading = "Block cache")]
    pub cache_size: Option<String>,

    /// Cache banks (files) [default: 16].
    #[arg(long, value_name = "N", help_heading = "Block cache")]
    pub cache_banks: Option<u32>,

    /// Cache associativity, frames per set [default: 16].
    #[arg(long, value_name = "N", help_heading = "Block cache")]
    pub cache_ways: Option<u32>,

    /// Cache block size, a power of two from 4K to 1M [default: 64K].
    #[arg(long, value_name = "SIZE", help_heading = "Block cache")]
    pub block_size: Option<String>,

    /// write-back (writes stay in the cache until `gvfsctl writeback`,
    /// `flush`, SIGUSR1/SIGUSR2 or exit) or write-through [default: write-back].
    #[arg(long, value_name = "POLICY", help_heading = "Block cache")]
    pub write_policy: Option<String>,

    /// Most blocks to read ahead on sequential access (as many as the
    /// sequential run has read so far, up to N); 0 turns it off [default: 32].
    #[arg(long = "readahead", value_name = "N", help_heading = "Block cache")]
    pub readahead_blocks: Option<u32>,

    /// Leave dirty data in the cache on SIGTERM/SIGINT, for the next start
    /// (a file's `writeback_on_exit = false`; by default it is written
    /// back).
    #[arg(
        long = "no-writeback-on-exit",
        num_args = 0,
        default_missing_value = "false",
        help_heading = "Block cache"
    )]
    pub writeback_on_exit: Option<bool>,

    /// Longest write-back on exit [default: 60].
    #[arg(
        long = "exit-writeback-timeout",
        value_name = "SECS",
        help_heading = "Block cache"
    )]
    pub exit_writeback_timeout_secs: Option<u64>,
}

// TLS between proxies: this node's certificate and how peers are mapped.
#[allow(missing_docs)]
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, Serialize, clap::Args)]
pub struct TlsSection {
    /// Accept gvfs:// peers (other proxies) over TLS 1.3 here; they must
    /// present a certificate signed by --ca.
    #[arg(long, value_name = "IP:PORT", help_heading = "TLS")]
    pub listen_tls: Option<String>,

    /// This node's certificate (PEM), from `gvfsctl ca issue`.
    #[arg(long, value_name = "FILE", help_heading = "TLS")]
    pub cert: Option<PathBuf>,

    /// This node's private key (PEM).
    #[arg(long, value_name = "FILE", help_heading = "TLS")]
    pub key: Option<PathBuf>,

    /// The site CA certificate (PEM) that peers' certificates must chain to.
    #[arg(long, value_name = "FILE", help_heading = "TLS")]
    pub ca: Option<PathBuf>,

    /// Longest TLS handshake [default: 10].
    #[arg(long = "handshake-timeout", value_name = "SECS", help_heading = "TLS")]
    pub handshake_timeout_secs: Option<u64>,

    /// Identity mapping per peer certificate name (the `[peers]` table;
    /// `--map-peer NAME=MAPPING` on the command line).
    #[arg(skip)]
    pub peers: Option<std::collections::BTreeMap<String, String>>,

    /// Mapping of peers with no --map-peer rule [default: squash].
    #[arg(long, value_name = "MAPPING", help_heading = "TLS")]
    pub unknown_peers: Option<String>,

    /// uid and gid of squashed calls [default: 65534, 65534] (TOML only).
    #[arg(skip)]
    pub nobody: Option<(u32, u32)>,
}

// Metadata actions: zero maps and compress-and-copy.
#[allow(missing_docs)]
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, Serialize, clap::Args)]
pub struct MetaSection {
    /// Use metadata files found upstream (`.NAME.gvfsmeta`, made with
    /// `gvfsctl meta gen`): reads of zero blocks are answered locally,
    /// files marked for compress-and-copy are fetched whole, compressed,
    /// into a file cache, and other proxies fetching them whole are sent
    /// each repeated block once [default: on when there is a block cache or
    /// a --listen-tls port]; --no-meta turns it off.
    #[arg(
        long,
        num_args = 0,
        default_missing_value = "true",
        overrides_with = "meta",
        help_heading = "Metadata actions"
    )]
    pub meta: Option<bool>,

    /// Most bytes of whole files kept by compress-and-copy (in
    /// CACHE_DIR/files), e.g. 16G [default: 16G].
    #[arg(long, value_name = "SIZE", help_heading = "Metadata actions")]
    pub file_cache_size: Option<String>,

    /// Copy blocks an image shares with images held in the file cache
    /// instead of fetching them, by the block hashes in its metadata file
    /// (each copy checked against its hash first) [default: on with a
    /// cache dir]; --no-dedup turns it off.
    #[arg(
        long,
        num_args = 0,
        default_missing_value = "true",
        overrides_with = "dedup",
        help_heading = "Metadata actions"
    )]
    pub dedup: Option<bool>,

    /// How long a lazy clone's node learns its guest's working set after
    /// the first page the guest touches: the profile learned is then kept
    /// and sent upstream, even if the guest never goes quiet (3 s without a
    /// new page ends it sooner, and so does `gvfsctl learned`), from 1 to
    /// 300 [default: 20].
    #[arg(
        long = "learn-window",
        value_name = "SECS",
        help_heading = "Metadata actions"
    )]
    pub learn_window_secs: Option<u64>,
}

impl FileConfig {
    /// Reads and parses a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::parse(&text).map_err(|reason| ConfigError::Parse {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Parses a TOML text; the error names the line and column (and toml's
    /// shows the line).
    pub fn parse(text: &str) -> Result<Self, String> {
        let parse_error = |e: toml::de::Error| e.to_string().trim_end().to_string();
        // The sections are flattened into one level of keys, which serde
        // cannot check for strangers: look for them first.
        let table: toml::Table = toml::from_str(text).map_err(parse_error)?;
        let known = Self::keys();
        if let Some(key) = table.keys().find(|k| !known.contains(k.as_str())) {
            return Err(unknown_key(text, key));
        }
        toml::from_str(text).map_err(parse_error)
    }

    /// Every key a file may hold: the flags' names, and the two settings
    /// with no flag.
    pub fn keys() -> BTreeSet<String> {
        let cmd = <FileConfig as clap::Args>::augment_args(clap::Command::new("gvfs-proxy"));
        cmd.get_arguments()
            .map(|a| a.get_id().to_string())
            .chain(["peers".to_string(), "nobody".to_string()])
            .collect()
    }

    /// `other`'s values where set, ours elsewhere; `[peers]` rules from
    /// both (`other`'s for a name in both).
    pub fn overridden_by(self, other: FileConfig) -> Result<FileConfig, ConfigError> {
        let peers = match (self.tls.peers.clone(), other.tls.peers.clone()) {
            (Some(mut a), Some(b)) => {
                a.extend(b);
                Some(a)
            }
            (a, b) => b.or(a),
        };
        let as_json = |c: &FileConfig| {
            serde_json::to_value(c)
                .map_err(|e| ConfigError::Invalid(format!("cannot merge settings: {e}")))
        };
        let mut merged = as_json(&self)?;
        if let (Some(into), serde_json::Value::Object(from)) =
            (merged.as_object_mut(), as_json(&other)?)
        {
            into.extend(from.into_iter().filter(|(_, v)| !v.is_null()));
        }
        let mut merged: FileConfig = serde_json::from_value(merged)
            .map_err(|e| ConfigError::Invalid(format!("cannot merge settings: {e}")))?;
        merged.tls.peers = peers;
        Ok(merged)
    }
}

/// Where `key` is set in `text` (line and column, from 1), for the error.
fn unknown_key(text: &str, key: &str) -> String {
    let at = text.lines().enumerate().find_map(|(n, line)| {
        let start = line.len() - line.trim_start().len();
        let rest = line[start..]
            .trim_start_matches(['"', '\''])
            .strip_prefix(key)?;
        rest.trim_start_matches(['"', '\''])
            .trim_start()
            .starts_with('=')
            .then_some((n + 1, start + 1))
    });
    let what = format!(
        "unknown field `{key}` (the keys are the long options without --, with _ for -; \
         see gvfs-proxy --help)"
    );
    match at {
        Some((line, column)) => format!("line {line}, column {column}: {what}"),
        None => what,
    }
}
