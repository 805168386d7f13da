//! What `gvfsctl status` and `stats` and the metrics endpoint show: live
//! counters of the front end, the connections and each layer.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::{Value, json};

use crate::front::{self, FrontEnd};
use crate::server::{MemoryBudget, ServerStats};
use crate::stack::Stack;
use crate::{Ready, writeback};

/// Answers control requests from live counters.
pub(crate) struct StatusSource {
    pub(crate) ready: Ready,
    pub(crate) front: Arc<FrontEnd>,
    pub(crate) server: Arc<ServerStats>,
    pub(crate) budget: Arc<MemoryBudget>,
    pub(crate) stack: Arc<Stack>,
    pub(crate) jobs: Arc<writeback::Jobs>,
    pub(crate) started: Instant,
}

impl StatusSource {
    pub(crate) fn handle(&self, req: &Value) -> Result<Value, String> {
        let cache = || {
            self.stack.cache.as_ref().ok_or_else(|| {
                "this proxy has no block cache (start it with --cache-dir)".to_string()
            })
        };
        match req["cmd"].as_str() {
            Some("status") => Ok(self.status()),
            Some("stats") => Ok(self.stats()),
            Some("writeback") => Ok(self.jobs.start(cache()?, writeback::JobKind::WriteBack)),
            Some("flush") => Ok(self.jobs.start(cache()?, writeback::JobKind::Flush)),
            Some(other) => Err(format!(
                "unknown command {other:?}; this proxy knows: status, stats, writeback, flush"
            )),
            None => Err("request has no \"cmd\"".into()),
        }
    }

    /// Everything: status, cache counters, the write-back job.
    pub(crate) fn stats(&self) -> Value {
        json!({
            "status": self.status(),
            "cache": self.stack.cache.as_ref().map(|c| json!(c.stats())),
            "meta": self.stack.meta.as_ref().map(|m| json!(m.stats())),
            "file_cache": self.stack.files.as_ref().map(|f| json!(f.stats())),
            "attr_cache": self.stack.attrs.as_ref().map(|a| json!(a.stats())),
            "ext": json!(self.stack.ext.stats()),
            "writeback": self.jobs.state(),
        })
    }

    fn status(&self) -> Value {
        let f = self.front.stats();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let calls: serde_json::Map<String, Value> = f
            .nfs_calls
            .iter()
            .enumerate()
            .filter(|(_, c)| load(c) > 0)
            .map(|(i, c)| (front::proc_name(i).to_string(), json!(load(c))))
            .collect();
        let upstream_client = self.stack.client.as_ref().map(|c| {
            let s = c.stats();
            json!({
                "server": c.server(),
                "calls": load(&s.calls),
                "retransmits": load(&s.retransmits),
                "connects": load(&s.connects),
            })
        });
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "listen": self.ready.addr.to_string(),
            "listen_tls": self.ready.tls_addr.map(|a| a.to_string()),
            "tls_name": self.ready.tls_name,
            "export": self.ready.export,
            "upstream": self.ready.upstream,
            "uptime_secs": self.started.elapsed().as_secs(),
            "connections": {
                "open": load(&self.server.open),
                "accepted": load(&self.server.accepted),
                "closed_oversized": load(&self.server.oversized),
                "tls_accepted": load(&self.server.tls_accepted),
                "tls_refused": load(&self.server.tls_refused),
                "starttls": load(&self.server.starttls),
                "pending": load(&self.server.pending),
                "evicted_pending": load(&self.server.evicted_pending),
                "evicted_idle": load(&self.server.evicted_idle),
                "slot_waits": load(&self.server.slot_waits),
                "timed_out": load(&self.server.timed_out),
            },
            "buffers": {
                "budget_bytes": self.budget.limit(),
                "held_bytes": self.budget.used(),
                "peak_bytes": self.budget.peak(),
                "throttled": self.budget.throttled(),
            },
            "nfs_calls": calls,
            "mount_calls": load(&f.mount_calls),
            "portmap_calls": load(&f.portmap_calls),
            "read_bytes": load(&f.read_bytes),
            "write_bytes": load(&f.write_bytes),
            "rpc_errors": load(&f.rpc_errors),
            "service_errors": load(&f.service_errors),
            "drc_hits": load(&f.drc_hits),
            "ext_calls": load(&f.ext_calls),
            "upstream_client": upstream_client,
            "cache": self.stack.cache.as_ref().map(|c| json!({"dirty_bytes": c.dirty_bytes()})),
        })
    }
}
