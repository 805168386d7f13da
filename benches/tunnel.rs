//! TLS between proxies (issue 4, "Benchmarks"), against real peers:
//! nfs-ganesha as the origin, `nfs-cp` as the client.
//!
//! Two paths to the same image-server proxy (in front of ganesha), used in
//! turns in one run:
//! - **plain hop**: client proxy `--upstream nfs://` to the image server's
//!   plain port;
//! - **TLS hop**: client proxy `--upstream gvfs://` to its `--listen-tls`
//!   port (TLS 1.3, mutual certificate authentication, identity mapping).
//!
//! Per repetition and path (order rotated): `nfs-cp` writes a 1 GiB file
//! (timed), the file at ganesha is compared with the source; `nfs-cp` reads
//! it back to `/dev/shm` (timed), compared. Then the TLS handshake time of
//! the tunnel's own connector to the `--listen-tls` port (TCP connect +
//! TLS 1.3 handshake with both certificates verified), p50/p99.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench
//! tunnel`. Environment: `GVFS_BENCH_MIB` (1024), `GVFS_BENCH_REPS` (3),
//! `GVFS_BENCH_HANDSHAKES` (500). Without `--bench` (under `cargo test
//! --benches`) it does a small smoke run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use gvfs_testbed::bench::{env_u64, loadavg};
use gvfs_testbed::data::{compare_files, write_random_file};
use gvfs_testbed::libnfs::CopyClient;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};

const SEED: u64 = 0x7475_6e6e_656c;

fn tls_args(ca: &Path, name: &str, p: ProxyArgs) -> ProxyArgs {
    p.tls(ca, name)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let bench = std::env::args().any(|a| a == "--bench");
    let mib = env_u64("GVFS_BENCH_MIB", if bench { 1024 } else { 8 })?;
    let reps = env_u64("GVFS_BENCH_REPS", if bench { 3 } else { 1 })? as usize;
    let handshakes = env_u64("GVFS_BENCH_HANDSHAKES", if bench { 500 } else { 20 })? as usize;

    let local = gvfs_testbed::bench::shm_tempdir()?;
    let work = tempfile::Builder::new().prefix("gvfs-bench-").tempdir()?;
    let pki = gvfs_testbed::site::Pki::new(&["image-server", "node1"])?;
    let ca: PathBuf = pki.ca_dir().to_path_buf();
    let ganesha = Ganesha::start().context("starting nfs-ganesha")?;
    eprintln!("load average {} at start", loadavg());
    let server = Proxy::spawn(
        tls_args(&ca, "image-server", ProxyArgs::new(ganesha.upstream_url()))
            .listen_tls(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            .map_peer("node1", "pass")
            .env("RUST_LOG", "warn"),
    )?;
    let tls_addr: std::net::SocketAddr = server
        .status()?
        .listen_tls
        .context("no TLS listener")?
        .parse()?;
    let plain = Proxy::spawn(
        ProxyArgs::new(format!(
            "nfs://127.0.0.1:{}/export?mountport={}",
            server.port(),
            server.port()
        ))
        .env("RUST_LOG", "warn"),
    )?;
    let tls = Proxy::spawn(
        tls_args(
            &ca,
            "node1",
            ProxyArgs::new(format!("gvfs://{tls_addr}/export?name=image-server")),
        )
        .env("RUST_LOG", "warn"),
    )?;
    let paths: [(&str, &Proxy); 2] = [("plain hop", &plain), ("TLS hop", &tls)];

    let src = work.path().join("src.bin");
    write_random_file(&src, SEED, mib << 20)?;
    let src_s = src.display().to_string();
    let timeout = Duration::from_secs(600);
    // Warm-up: a fresh ganesha is slower on its first copies.
    for (i, (_, p)) in paths.iter().enumerate() {
        let name = format!("warm-{i}.bin");
        CopyClient::NfsCp.copy(&src_s, &p.url(&name), timeout)?;
        std::fs::remove_file(ganesha.export_dir().join(&name))?;
    }
    let mut write = [Vec::new(), Vec::new()];
    let mut read = [Vec::new(), Vec::new()];
    for rep in 0..reps {
        for k in 0..paths.len() {
            let i = (k + rep) % paths.len();
            let (label, p) = paths[i];
            let name = format!("bench-{rep}-{i}.bin");
            let t = Instant::now();
            CopyClient::NfsCp.copy(&src_s, &p.url(&name), timeout)?;
            write[i].push(mib as f64 / t.elapsed().as_secs_f64());
            let at_origin = ganesha.export_dir().join(&name);
            compare_files(&src, &at_origin).with_context(|| format!("{label}: written"))?;
            let back = local.path().join(&name);
            let t = Instant::now();
            CopyClient::NfsCp.copy(&p.url(&name), &back.display().to_string(), timeout)?;
            read[i].push(mib as f64 / t.elapsed().as_secs_f64());
            compare_files(&src, &back).with_context(|| format!("{label}: read"))?;
            std::fs::remove_file(&back)?;
            std::fs::remove_file(&at_origin)?;
            eprintln!(
                "rep {rep} {label}: write {:.0} MiB/s, read {:.0} MiB/s",
                write[i].last().copied().unwrap_or(0.0),
                read[i].last().copied().unwrap_or(0.0)
            );
        }
    }

    // Handshakes: the connector gvfs:// upstreams use.
    let identity = gvfs_tunnel::TlsIdentity::load(&gvfs_tunnel::TlsFiles {
        cert: ca.join("node1.pem"),
        key: ca.join("node1-key.pem"),
        ca: ca.join("ca.pem"),
    })?;
    let connector = gvfs_tunnel::TlsConnector::new(
        "127.0.0.1".into(),
        tls_addr.port(),
        Some("image-server".into()),
        &identity,
        Duration::from_secs(5),
        Duration::from_secs(5),
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut times = rt.block_on(async {
        let mut times = Vec::with_capacity(handshakes);
        for _ in 0..handshakes {
            let t = Instant::now();
            let (s, _name) = connector.open().await?;
            times.push(t.elapsed());
            drop(s);
        }
        Ok::<_, anyhow::Error>(times)
    })?;
    times.sort();

    let mut out = String::new();
    out += &format!(
        "\n{mib} MiB with nfs-cp, {reps} repetitions (median, min-max MiB/s); load average {} at the end\n\n",
        loadavg()
    );
    out += "| path | write MiB/s | vs plain | read MiB/s | vs plain |\n|---|---:|---:|---:|---:|\n";
    let (pw, pr) = (median(&mut write[0].clone()), median(&mut read[0].clone()));
    for (i, (label, _)) in paths.iter().enumerate() {
        let range = |v: &[f64]| {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(0.0, f64::max);
            format!("{lo:.0}-{hi:.0}")
        };
        let (w, r) = (median(&mut write[i].clone()), median(&mut read[i].clone()));
        out += &format!(
            "| {label} | {w:.0} ({}) | {:.2}x | {r:.0} ({}) | {:.2}x |\n",
            range(&write[i]),
            w / pw,
            range(&read[i]),
            r / pr
        );
    }
    out += &format!(
        "\nTLS 1.3 handshake (TCP connect + mutual authentication), {} samples: p50 {:?}, p99 {:?}, max {:?}\n",
        times.len(),
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times.last().copied().unwrap_or_default()
    );
    println!("{out}");
    let refused = server.status()?.connections.counts.tls_refused;
    ensure!(refused == 0, "the server refused {refused} connections");
    Ok(())
}
