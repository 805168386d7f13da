//! What `gvfsctl status` and `stats` and the metrics endpoint show: live
//! counters of the front end, the connections and each layer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::control::CommandError;
use crate::front::{self, FrontEnd};
use crate::ready::Ready;
use crate::server::{ConnCounts, MemoryBudget, ServerStats};
use crate::stack::Stack;
use crate::{config, writeback};

/// What `stats` answers: the status and every layer's counters (a layer
/// the proxy does not run is `null`). `gvfsctl` reads it back with this
/// type; the metrics endpoint shows each number as a gauge.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// What `status` answers.
    pub status: Status,
    /// The block cache.
    pub cache: Option<gvfs_cache::LayerStats>,
    /// The metadata layer.
    pub meta: Option<gvfs_meta::MetaStats>,
    /// The file cache (compress-and-copy).
    pub file_cache: Option<gvfs_filecache::FileCacheStats>,
    /// The attribute cache.
    pub attr_cache: Option<gvfs_attrcache::AttrCacheStats>,
    /// The extension program, answering other proxies.
    pub ext: crate::ext_server::ExtStats,
    /// The write-back job.
    pub writeback: writeback::JobState,
}

/// What `status` answers: what is served, connections, calls.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Status {
    /// gvfs-proxy's version.
    pub version: String,
    /// Its process id.
    pub pid: u32,
    /// The NFS listener's address.
    pub listen: String,
    /// The TLS listener's address, when there is one.
    pub listen_tls: Option<String>,
    /// This node's certificate name, when TLS is configured.
    pub tls_name: Option<String>,
    /// The export clients mount.
    pub export: String,
    /// The stack, described.
    pub upstream: String,
    /// Seconds since start.
    pub uptime_secs: u64,
    /// Connections.
    pub connections: Connections,
    /// Buffer memory across connections.
    pub buffers: Buffers,
    /// NFS calls by procedure (those called at least once).
    pub nfs_calls: BTreeMap<String, u64>,
    /// The front end's other counts: MOUNT, PORTMAP and extension calls,
    /// bytes read and written, refusals, failures, retransmissions.
    #[serde(flatten)]
    pub front: front::FrontCounts,
    /// The RPC client to the upstream, when it is reached over RPC.
    pub upstream_client: Option<UpstreamClient>,
    /// The block cache's dirty bytes, when there is one.
    pub cache: Option<DirtyBytes>,
    /// The FUSE mount, when there is one (`--mount`).
    pub mount: Option<gvfs_fuse::FuseStats>,
}

/// Connections (see [`ServerStats`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Connections {
    /// Open now.
    pub open: u64,
    /// Pending (not yet past their first call or handshake) now.
    pub pending: u64,
    /// What happened to connections since start.
    #[serde(flatten)]
    pub counts: ConnCounts,
}

/// The memory budget of all connections.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Buffers {
    /// The budget (`--buffer-memory`).
    pub budget_bytes: u64,
    /// Held now.
    pub held_bytes: u64,
    /// Most held at once.
    pub peak_bytes: u64,
    /// Times a connection waited for room.
    pub throttled: u64,
    /// Tenants (certificate names, else connections) holding bytes now.
    pub busy_tenants: u64,
    /// The most one tenant holds now.
    pub largest_tenant_bytes: u64,
}

/// The RPC client to the upstream.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct UpstreamClient {
    /// The server it talks to.
    pub server: String,
    /// Calls sent.
    pub calls: u64,
    /// Calls sent again.
    pub retransmits: u64,
    /// Connections made.
    pub connects: u64,
    /// The link to the server as the client measures it, once a call has
    /// been answered.
    pub link: Option<LinkStatus>,
    /// The gate fetches to the server pass.
    pub gate: Option<gvfs_ext::gate::GateStats>,
}

/// The link to the upstream, measured from the RPC client's calls
/// ([`gvfs_nfs::net::estimate`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LinkStatus {
    /// The least round trip in the last 10 s, microseconds.
    pub min_rtt_us: u64,
    /// The most delivery rate in the last 10 round trips, bits per second.
    pub rate_bps: u64,
    /// Their product, the bytes in flight that fill the link.
    pub bdp_bytes: u64,
}

/// The block cache's dirty bytes (in `status`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DirtyBytes {
    /// Bytes of dirty data cached.
    pub dirty_bytes: u64,
}

/// Most fingerprints one `held_blocks` request may ask about (a request is
/// at most 64 KiB).
pub const MAX_HELD_QUERY: usize = 2048;

/// Answers control requests from live counters.
pub(crate) struct StatusSource {
    pub(crate) ready: Ready,
    pub(crate) front: Arc<FrontEnd>,
    pub(crate) server: Arc<ServerStats>,
    pub(crate) budget: Arc<MemoryBudget>,
    pub(crate) stack: Arc<Stack>,
    pub(crate) jobs: Arc<writeback::Jobs>,
    pub(crate) mount: Option<Arc<gvfs_fuse::Mount>>,
    pub(crate) started: Instant,
    /// Cancelled to stop the proxy (`gvfsctl unmount`, a hand-over).
    pub(crate) shutdown: tokio_util::sync::CancellationToken,
    /// Set by a hand-over: the stop leaves the cache to the successor.
    pub(crate) handing_over: Arc<std::sync::atomic::AtomicBool>,
}

impl StatusSource {
    pub(crate) fn handle(&self, req: &Value) -> Result<Value, CommandError> {
        // Write-back jobs need a block cache, whose dirty data they send.
        let job = |kind| match &self.stack.cache {
            Some(_) => Ok(self.jobs.start(kind)),
            None => Err(CommandError::NoBlockCache),
        };
        match req["cmd"].as_str() {
            Some("status") => Ok(json!(self.status())),
            Some("stats") => Ok(json!(self.stats())),
            Some("writeback") => job(writeback::JobKind::WriteBack),
            Some("flush") => job(writeback::JobKind::Flush),
            Some("held_blocks") => self.held_blocks(req),
            Some("learned") => self.learned(req),
            Some("unmount") => self.unmount(req),
            Some(crate::handover::COMMAND) => self.hand_over(),
            Some(other) => Err(CommandError::UnknownCommand(other.to_string())),
            None => Err(CommandError::NoCommand),
        }
    }

    /// Everything: status, each layer's counters, the write-back job.
    pub(crate) fn stats(&self) -> Stats {
        Stats {
            status: self.status(),
            cache: self.stack.cache.as_ref().map(|c| c.stats()),
            meta: self.stack.meta.as_ref().map(|m| m.stats()),
            file_cache: self.stack.files.as_ref().map(|f| {
                let mut stats = f.stats();
                if let Some(meta) = &self.stack.meta {
                    for d in &mut stats.dedup_files {
                        d.name =
                            gvfs_filecache::parse_handle(&d.fh).and_then(|fh| meta.name_of(&fh));
                    }
                }
                stats
            }),
            attr_cache: self.stack.attrs.as_ref().map(|a| a.stats()),
            ext: self.stack.ext.stats(),
            writeback: self.jobs.state(),
        }
    }

    /// Ends the mount for good: the proxy unmounts it and exits, instead
    /// of leaving it paused for the next proxy. With files open (guests
    /// map them) only when `req["force"]` is true: their users get errors.
    fn unmount(&self, req: &Value) -> Result<Value, CommandError> {
        let mount = self.mount.as_ref().ok_or(CommandError::NoMount)?;
        let force = match &req["force"] {
            Value::Null => false,
            Value::Bool(b) => *b,
            _ => return Err(CommandError::BadArgument("\"force\" must be true or false")),
        };
        let open = mount.open_files();
        if open > 0 && !force {
            return Err(CommandError::FilesOpen(open));
        }
        mount.tear_down_at_stop();
        self.shutdown.cancel();
        Ok(json!({ "unmounting": mount.path().display().to_string(), "open": open }))
    }

    /// Stops this proxy for one that replaces it at once (`gvfs-proxy
    /// --take-over`): the mount is paused even with nothing open, and the
    /// layers close without the exit write-back. Answers this pid, for the
    /// successor to wait on.
    fn hand_over(&self) -> Result<Value, CommandError> {
        if let Some(mount) = &self.mount
            && !mount.hand_over_at_stop()
        {
            return Err(CommandError::MountNotKept);
        }
        self.handing_over.store(true, Ordering::Relaxed);
        self.shutdown.cancel();
        Ok(json!({ "pid": std::process::id() }))
    }

    /// Ends the learnings of working sets under way, of the files named
    /// `req["name"]` (as a LOOKUP named them), or of every file without a
    /// name: their profiles are published now. Answers how many it ended.
    fn learned(&self, req: &Value) -> Result<Value, CommandError> {
        let files = self.stack.files.as_ref().ok_or(CommandError::NoFileCache)?;
        let name = match &req["name"] {
            Value::Null => None,
            Value::String(s) => Some(s.as_str()),
            _ => return Err(CommandError::BadArgument("\"name\" must be a file name")),
        };
        let meta = self.stack.meta.as_ref();
        let ended = files.end_learning(|fh| {
            name.is_none_or(|n| meta.and_then(|m| m.name_of(fh)).as_deref() == Some(n))
        });
        Ok(json!({ "ended": ended }))
    }

    /// How many of the block fingerprints `req["hashes"]` (hex, at most
    /// [`MAX_HELD_QUERY`]) the file cache holds a block of.
    fn held_blocks(&self, req: &Value) -> Result<Value, CommandError> {
        let files = self.stack.files.as_ref().ok_or(CommandError::NoFileCache)?;
        let list = req["hashes"].as_array().ok_or(CommandError::BadArgument(
            "\"hashes\" must be a list of block fingerprints in hex",
        ))?;
        if list.len() > MAX_HELD_QUERY {
            return Err(CommandError::BadArgument(
                "more than 800 hashes in one request",
            ));
        }
        let mut hashes = Vec::with_capacity(list.len());
        for h in list {
            let bytes = h
                .as_str()
                .and_then(gvfs_filecache::parse_handle)
                .and_then(|b| <gvfs_metafile::Fingerprint>::try_from(b.as_slice()).ok())
                .ok_or(CommandError::BadArgument(
                    "a fingerprint is not 16 hex digits",
                ))?;
            hashes.push(bytes);
        }
        let held = files.blocks_held(&hashes).map_err(|e| {
            tracing::warn!(error = %e, "dedup index lookup failed");
            CommandError::BadArgument("the block index could not be read")
        })?;
        Ok(json!({ "held": held, "dedup": files.dedup_on() }))
    }

    /// The upstream's RPC client, its link and its gate.
    fn upstream_client(&self) -> Option<UpstreamClient> {
        let c = self.stack.client.as_ref()?;
        let u = c.stats().snapshot();
        let link = c.link().estimate().map(|e| LinkStatus {
            min_rtt_us: u64::try_from(e.min_rtt.as_micros()).unwrap_or(u64::MAX),
            rate_bps: e.rate.saturating_mul(8),
            bdp_bytes: e.bdp(),
        });
        Some(UpstreamClient {
            server: c.server().to_string(),
            calls: u.calls,
            retransmits: u.retransmits,
            connects: u.connects,
            link,
            gate: self.stack.gate.as_ref().map(|g| g.stats()),
        })
    }

    fn status(&self) -> Status {
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let s = &self.server;
        Status {
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            listen: self
                .ready
                .addr
                .map_or_else(|| config::NO_LISTENER.to_string(), |a| a.to_string()),
            listen_tls: self.ready.tls_addr.map(|a| a.to_string()),
            tls_name: self.ready.tls_name.clone(),
            export: self.ready.export.clone(),
            upstream: self.ready.upstream.clone(),
            uptime_secs: self.started.elapsed().as_secs(),
            connections: Connections {
                open: load(&s.open),
                pending: load(&s.pending),
                counts: s.counts.snapshot(),
            },
            buffers: Buffers {
                budget_bytes: self.budget.limit(),
                held_bytes: self.budget.used(),
                peak_bytes: self.budget.peak(),
                throttled: self.budget.throttled(),
                busy_tenants: self.budget.busy_tenants(),
                largest_tenant_bytes: self.budget.largest_tenant(),
            },
            nfs_calls: self.front.nfs_calls(),
            front: self.front.stats(),
            upstream_client: self.upstream_client(),
            cache: self.stack.cache.as_ref().map(|c| DirtyBytes {
                dirty_bytes: c.dirty_bytes(),
            }),
            mount: self.mount.as_ref().map(|m| m.stats()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters' snapshots are flattened into their objects: the names
    /// `gvfsctl`, the metrics endpoint and scripts read stay where they
    /// were.
    #[test]
    fn counters_keep_their_flat_names() {
        let v = json!(Status::default());
        for key in [
            "mount_calls",
            "portmap_calls",
            "read_bytes",
            "write_bytes",
            "rpc_errors",
            "service_errors",
            "drc_hits",
            "ext_calls",
        ] {
            assert!(v[key].is_u64(), "status.{key}: {v}");
        }
        for key in [
            "open",
            "accepted",
            "closed_oversized",
            "tls_accepted",
            "tls_refused",
            "starttls",
            "pending",
            "evicted_pending",
            "evicted_idle",
            "slot_waits",
            "timed_out",
        ] {
            assert!(v["connections"][key].is_u64(), "connections.{key}: {v}");
        }
        let back: Status = serde_json::from_value(v).unwrap();
        assert_eq!(back.connections.counts, ConnCounts::default());
    }

    /// The link estimate and the gate's counters sit under the upstream
    /// client, by the names scripts read.
    #[test]
    fn the_link_and_the_gate_are_under_the_upstream_client() {
        let u = UpstreamClient {
            link: Some(LinkStatus {
                min_rtt_us: 40_000,
                rate_bps: 80_000_000,
                bdp_bytes: 400_000,
            }),
            gate: Some(gvfs_ext::gate::GateStats::default()),
            ..UpstreamClient::default()
        };
        let v = json!(u);
        for key in ["min_rtt_us", "rate_bps", "bdp_bytes"] {
            assert!(v["link"][key].is_u64(), "link.{key}: {v}");
        }
        for key in [
            "low_in_flight_bytes",
            "cap_bytes",
            "urgent_cap_bytes",
            "part_bytes",
            "queued",
        ] {
            assert!(v["gate"][key].is_u64(), "gate.{key}: {v}");
        }
        for class in ["bulk", "background", "profile", "demand"] {
            for key in ["waits", "wait_micros", "admitted_bytes"] {
                assert!(v["gate"][class][key].is_u64(), "gate.{class}.{key}: {v}");
            }
        }
    }
}
