//! The plan: which layers a configuration stacks, bottom first, with their
//! settings, decided in one place. [`Stack::build`] walks it to build the
//! stack; `gvfs-proxy --check` ([`crate::check`]) describes it without
//! opening anything. A condition changed here changes both.
//!
//! [`Stack::build`]: crate::stack::Stack::build

use std::time::Duration;

use gvfs_upstream::UpstreamUrl;

use crate::config::{CacheSettings, Config, UpstreamChoice};

/// One layer of a plan, with the settings it is built with.
#[derive(Debug, Clone, Copy)]
pub enum Planned<'a> {
    /// The bottom: a `dir:` directory or an NFSv3 server (`nfs://`,
    /// `gvfs://`). Always there.
    Upstream(&'a UpstreamChoice),
    /// The block cache (`--cache-dir`).
    BlockCache(&'a CacheSettings),
    /// The attribute cache (`--attr-timeout`): answers from replies at
    /// most this old.
    AttrCache(Duration),
    /// The metadata layer (`--meta`, the default with a cache), with the
    /// file cache when there is a cache directory to keep it in.
    Meta {
        /// Where the file cache lives, when there is one.
        file_cache: Option<&'a CacheSettings>,
    },
}

impl Planned<'_> {
    /// The layer's name, as `--check` prints it and as the built layer
    /// calls itself (its [`Lifecycle::name`]).
    ///
    /// [`Lifecycle::name`]: gvfs_nfs::layer::Lifecycle::name
    pub fn name(&self) -> &'static str {
        match self {
            Self::Upstream(_) => "upstream",
            Self::BlockCache(_) => "block cache",
            Self::AttrCache(_) => "attribute cache",
            Self::Meta { .. } => "metadata layer",
        }
    }
}

/// The layers `cfg` asks for, bottom first.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    cfg: &'a Config,
    layers: Vec<Planned<'a>>,
}

/// One layer of a plan described for humans: its name and its settings in
/// a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedLayer {
    /// The layer, e.g. "block cache".
    pub name: &'static str,
    /// Its settings, for humans.
    pub settings: String,
}

/// The layers `cfg` stacks, bottom first.
pub fn plan(cfg: &Config) -> Plan<'_> {
    let mut layers = vec![Planned::Upstream(&cfg.upstream)];
    if let Some(c) = &cfg.cache {
        layers.push(Planned::BlockCache(c));
    }
    if let Some(ttl) = cfg.attr_timeout {
        layers.push(Planned::AttrCache(ttl));
    }
    if cfg.meta {
        layers.push(Planned::Meta {
            file_cache: cfg.cache.as_ref(),
        });
    }
    Plan { cfg, layers }
}

impl<'a> Plan<'a> {
    /// The layers, bottom first.
    pub fn layers(&self) -> &[Planned<'a>] {
        &self.layers
    }

    /// The metadata layer's file cache settings, when it has a file cache.
    pub fn file_cache(&self) -> Option<&'a CacheSettings> {
        self.layers.iter().find_map(|l| match l {
            Planned::Meta { file_cache } => *file_cache,
            _ => None,
        })
    }

    /// Whether the metadata layer is stacked.
    pub fn meta(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, Planned::Meta { .. }))
    }

    /// Whether blocks are shared by content across files: the file cache
    /// and the block cache find each other's blocks by content hash. Needs
    /// the file cache (so the block cache below it too) and `dedup`.
    pub fn dedup(&self) -> bool {
        self.file_cache().is_some_and(|c| c.dedup)
    }

    /// Each layer described, bottom first.
    pub fn describe(&self) -> Vec<PlannedLayer> {
        self.layers
            .iter()
            .map(|l| PlannedLayer {
                name: l.name(),
                settings: self.settings(l),
            })
            .collect()
    }

    /// `layer`'s settings in a line.
    fn settings(&self, layer: &Planned<'_>) -> String {
        match layer {
            Planned::Upstream(_) => describe_upstream(self.cfg),
            Planned::BlockCache(c) => {
                let g = &c.geometry;
                let on_exit = match (c.layer.policy, c.writeback_on_exit) {
                    (gvfs_cache::WritePolicy::WriteThrough, _) => String::new(),
                    (_, true) => format!(
                        ", written back on exit within {} s",
                        c.exit_writeback_timeout.as_secs()
                    ),
                    (_, false) => ", dirty data kept on exit".to_owned(),
                };
                format!(
                    "{}: {}, {} blocks, {} banks x {} ways, read-ahead {} blocks, {}{on_exit}",
                    c.dir.display(),
                    human_bytes(g.capacity()),
                    human_bytes(u64::from(g.block_size())),
                    g.banks(),
                    g.ways(),
                    c.layer.readahead_blocks,
                    c.layer.policy,
                )
            }
            Planned::AttrCache(ttl) => {
                format!("answers from replies at most {} s old", ttl.as_secs())
            }
            Planned::Meta { file_cache } => {
                let files = match file_cache {
                    Some(c) => format!(
                        "file cache in {} (at most {}), dedup across images {}",
                        c.dir.join("files").display(),
                        human_bytes(c.file_cache_size),
                        if c.dedup { "on" } else { "off" }
                    ),
                    None => "no file cache (no cache_dir): peers' whole-file fetches are read \
                             from the upstream"
                        .to_owned(),
                };
                format!("zero maps and compress-and-copy; {files}")
            }
        }
    }
}

/// The upstream of `cfg` in a line.
fn describe_upstream(cfg: &Config) -> String {
    let waits = match cfg.upstream_timeout {
        None => "calls wait for it like a hard mount".to_owned(),
        Some(t) => format!("calls give up after {} s", t.as_secs()),
    };
    match &cfg.upstream {
        UpstreamChoice::Sample(dir) => format!(
            "dir:{} (the sample directory, made on first start)",
            dir.display()
        ),
        UpstreamChoice::Url(UpstreamUrl::Dir(dir)) => {
            format!("dir:{} (a local directory, no NFS server)", dir.display())
        }
        UpstreamChoice::Url(UpstreamUrl::Nfs(u)) => {
            let port = |p: Option<u16>| p.map_or("the portmapper's".to_owned(), |p| p.to_string());
            format!(
                "nfs://{}{} (NFSv3: NFS port {}, MOUNT port {}); {waits}",
                u.host,
                u.export,
                port(u.port),
                port(u.mount_port)
            )
        }
        UpstreamChoice::Url(UpstreamUrl::Gvfs(u)) => format!(
            "gvfs://{}:{}{} over mutually authenticated TLS 1.3, its certificate named {}; {waits}",
            u.host,
            u.port,
            u.export,
            u.server_name.as_deref().unwrap_or(&u.host)
        ),
    }
}

/// `n` bytes in the largest binary unit that divides it (`64 KiB`, `8 GiB`).
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    UNITS
        .iter()
        .find(|(_, shift)| n >= 1 << shift && n.trailing_zeros() >= *shift)
        .map_or(format!("{n} bytes"), |(unit, shift)| {
            format!("{} {unit}", n >> shift)
        })
}
