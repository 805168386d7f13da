//! The proxy's counters, typed: what `gvfsctl stats --json` prints, read
//! back into the proxy's own [`gvfs_proxy::status::Stats`] (the type its
//! control socket serializes, and `gvfsctl` and the metrics endpoint read),
//! so a test names each counter as a field: a counter renamed or removed
//! in the proxy breaks the test's build instead of reading as 0.
//!
//! A layer the proxy does not run (`null` in the JSON) reads as all zeros,
//! as the old string paths did; the JSON itself is kept for messages
//! ([`Stats`] displays as it).

use std::fmt;

use anyhow::{Context, Result};
use gvfs_attrcache::AttrCacheStats;
use gvfs_cache::LayerStats;
use gvfs_filecache::FileCacheStats;
use gvfs_fuse::FuseStats;
use gvfs_meta::MetaStats;
use gvfs_proxy::ext_server::ExtStats;
use gvfs_proxy::status::Status;
use gvfs_proxy::writeback::JobState;

/// One `gvfsctl stats --json` snapshot of a proxy.
#[derive(Debug, Clone)]
pub struct Stats {
    /// What `gvfsctl status` shows: connections, calls by procedure, the
    /// mount.
    pub status: Status,
    /// The block cache (zeros without `--cache-dir`).
    pub cache: LayerStats,
    /// The metadata layer (zeros when it is off).
    pub meta: MetaStats,
    /// The file cache of compress-and-copy (zeros without one).
    pub file_cache: FileCacheStats,
    /// The attribute cache (zeros without `--attr-timeout`).
    pub attr_cache: AttrCacheStats,
    /// The extension program, answering other proxies.
    pub ext: ExtStats,
    /// The write-back job (`gvfsctl writeback`): running, bytes done.
    pub writeback: JobState,
    /// The snapshot as the proxy sent it.
    json: serde_json::Value,
}

impl Stats {
    /// Reads the snapshot `gvfsctl stats --json` printed.
    pub fn from_json(json: serde_json::Value) -> Result<Self> {
        let typed: gvfs_proxy::status::Stats = serde_json::from_value(json.clone())
            .with_context(|| format!("gvfsctl stats --json printed an unknown shape: {json}"))?;
        Ok(Self {
            status: typed.status,
            cache: typed.cache.unwrap_or_default(),
            meta: typed.meta.unwrap_or_default(),
            file_cache: typed.file_cache.unwrap_or_default(),
            attr_cache: typed.attr_cache.unwrap_or_default(),
            ext: typed.ext,
            writeback: typed.writeback,
            json,
        })
    }

    /// The FUSE mount's counters (`status.mount`); fails when the proxy
    /// has no mount.
    pub fn mount(&self) -> Result<&FuseStats> {
        self.status
            .mount
            .as_ref()
            .with_context(|| format!("no mount in gvfsctl stats: {self}"))
    }

    /// The snapshot as JSON, as the proxy sent it.
    pub fn json(&self) -> &serde_json::Value {
        &self.json
    }

    /// How many times the proxy ran NFS procedure `name` (`"READ"`), 0 if
    /// never: the procedures are the keys of `status.nfs_calls`.
    pub fn calls(&self, name: &str) -> u64 {
        self.status.nfs_calls.get(name).copied().unwrap_or(0)
    }
}

/// The JSON the proxy sent (compact), for messages.
impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.json.fmt(f)
    }
}
