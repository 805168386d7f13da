//! The Prometheus text endpoint (`--metrics ADDR`): the counters `gvfsctl
//! status` and `gvfsctl stats` show, for scraping.
//!
//! Every number in the proxy's stats snapshot becomes one metric named
//! `gvfs_` plus its path (`gvfs_cache_hits_total`,
//! `gvfs_nfs_calls_READ_total`, ...), encoded by `prometheus-client`. The
//! HTTP side is deliberately tiny: `GET /metrics` only, a request capped at
//! 8 KiB and 5 s, one response per connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Longest request accepted.
const MAX_REQUEST: usize = 8 * 1024;
/// Per-connection time limit.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Fields that are levels (gauges) rather than running totals (counters).
const GAUGES: [&str; 24] = [
    "open",
    "connections_pending",
    "buffers_budget_bytes",
    "buffers_held_bytes",
    "buffers_peak_bytes",
    "buffers_busy_tenants",
    "buffers_largest_tenant_bytes",
    "frame_bytes",
    "run_frame_bytes",
    "uptime_secs",
    "dirty_bytes",
    "cached_bytes",
    "capacity_bytes",
    "running",
    "done_bytes",
    "total_bytes",
    "link_min_rtt_us",
    "link_rate_bps",
    "link_bdp_bytes",
    "gate_low_in_flight_bytes",
    "gate_cap_bytes",
    "gate_urgent_cap_bytes",
    "gate_part_bytes",
    "gate_queued",
];

/// A source of the stats snapshot (the JSON `gvfsctl stats --json` prints).
pub type Snapshot = Arc<dyn Fn() -> Value + Send + Sync>;

struct StatsCollector(Snapshot);

impl std::fmt::Debug for StatsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatsCollector")
    }
}

/// Every numeric leaf of `v` with its path joined by `_`.
fn leaves(prefix: &str, v: &Value, out: &mut Vec<(String, u64, bool)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let name = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}_{k}")
                };
                leaves(&name, v, out);
            }
        }
        Value::Number(n) => {
            if let Some(x) = n.as_u64() {
                let field = prefix.rsplit('_').next().unwrap_or(prefix);
                let gauge = GAUGES.iter().any(|g| prefix.ends_with(g)) || field == "pid";
                out.push((prefix.to_string(), x, gauge));
            }
        }
        Value::Bool(b) => out.push((prefix.to_string(), u64::from(*b), true)),
        _ => {}
    }
}

/// A metric name from a stats path: `[a-zA-Z0-9_]` only.
fn metric_name(path: &str) -> String {
    path.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut out = Vec::new();
        leaves("", &(self.0)(), &mut out);
        for (path, value, gauge) in out {
            let name = metric_name(&path);
            let help = format!("gvfs-proxy {}", path.replace('_', " "));
            if gauge {
                let g = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
                let m = encoder.encode_descriptor(&name, &help, None, g.metric_type())?;
                g.encode(m)?;
            } else {
                let c = ConstCounter::new(value);
                let m = encoder.encode_descriptor(&name, &help, None, c.metric_type())?;
                c.encode(m)?;
            }
        }
        Ok(())
    }
}

/// The text exposition of `snapshot`.
pub fn render(snapshot: &Snapshot) -> String {
    let mut registry = Registry::with_prefix("gvfs");
    registry.register_collector(Box::new(StatsCollector(snapshot.clone())));
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
        text.clear();
    }
    text
}

/// Serves `GET /metrics` on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, snapshot: Snapshot, shutdown: CancellationToken) {
    while let Some((stream, peer)) =
        crate::server::accept_until(|| listener.accept(), "metrics", &shutdown).await
    {
        let snapshot = snapshot.clone();
        tokio::spawn(async move {
            if tokio::time::timeout(IO_TIMEOUT, answer(stream, &snapshot))
                .await
                .is_err()
            {
                tracing::debug!(%peer, "metrics request timed out");
            }
        });
    }
}

async fn answer(mut stream: tokio::net::TcpStream, snapshot: &Snapshot) -> std::io::Result<()> {
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 || req.len() + n > MAX_REQUEST {
            return Ok(());
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = req.split(|b| *b == b'\r').next().unwrap_or_default();
    let (status, body) = if line.starts_with(b"GET /metrics ") || line == b"GET /metrics" {
        ("200 OK", render(snapshot))
    } else {
        ("404 Not Found", "try GET /metrics\n".to_string())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Binds the metrics listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_become_counters_and_levels_gauges() {
        let snapshot: Snapshot = Arc::new(
            || json!({"cache": {"hits": 5, "dirty_bytes": 7}, "status": {"nfs_calls": {"READ": 3}, "connections": {"open": 1}, "upstream": "x"}}),
        );
        let text = render(&snapshot);
        assert!(text.contains("# TYPE gvfs_cache_hits counter"), "{text}");
        assert!(text.contains("gvfs_cache_hits_total 5"), "{text}");
        assert!(
            text.contains("# TYPE gvfs_cache_dirty_bytes gauge"),
            "{text}"
        );
        assert!(
            text.contains("gvfs_status_nfs_calls_READ_total 3"),
            "{text}"
        );
        assert!(text.contains("gvfs_status_connections_open 1"), "{text}");
        assert!(!text.contains("upstream"), "{text}");
    }
}
