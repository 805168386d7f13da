//! QEMU (an unmodified VMM's block layer, `qemu-img`) through gvfs. QEMU's
//! `nfs://` URLs take no port: QEMU asks the portmapper at HOST:111, so each
//! proxy here listens on a loopback address of its own, port 111, and
//! answers PORTMAP itself. `qemu-img convert` to the proxy exercises WRITE and
//! COMMIT; converting back and `qemu-img compare` checks every byte.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::data::write_sparse_file;
use gvfs_testbed::libnfs::qemu_img;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};

const MIB: u64 = 1 << 20;

fn on_111(last_octet: u8, upstream: String) -> Result<Proxy> {
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last_octet)), 111);
    Proxy::spawn(ProxyArgs::new(upstream).listen(addr))
        .context("proxy on port 111 (tests run as root)")
}

/// Builds a raw disk with data at scattered places, converts it to qcow2 on
/// the proxy, inspects it there, converts it back to raw and compares.
fn convert_round_trip(proxy: &Proxy, origin: &Path) -> Result<()> {
    let local = tempfile::tempdir()?;
    let raw = local.path().join("disk.raw");
    write_sparse_file(
        &raw,
        96 * MIB,
        3,
        &[(0, 64 * 1024), (7 * MIB + 512, 3 * MIB), (95 * MIB, MIB)],
    )?;
    let raw_s = raw.display().to_string();
    let url = format!("nfs://{}/export/disk.qcow2", proxy.ip());
    qemu_img(&["convert", "-f", "raw", "-O", "qcow2", &raw_s, &url])?;
    ensure!(
        origin.join("disk.qcow2").is_file(),
        "the qcow2 image did not land at the origin"
    );
    let info = qemu_img(&["info", &url])?;
    ensure!(
        info.contains("qcow2") && info.contains("96 MiB"),
        "unexpected qemu-img info: {info}"
    );
    qemu_img(&["check", &url])?;
    let back = local.path().join("back.raw");
    qemu_img(&[
        "convert",
        "-f",
        "qcow2",
        "-O",
        "raw",
        &url,
        &back.display().to_string(),
    ])?;
    qemu_img(&[
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        &raw_s,
        &back.display().to_string(),
    ])?;
    // The image at the origin is a valid qcow2 of the same content too.
    let at_origin = origin.join("disk.qcow2").display().to_string();
    qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &raw_s, &at_origin])?;
    // A qcow2 overlay (what a clone uses) whose backing file is on the proxy.
    let overlay = local.path().join("clone.qcow2");
    qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-F",
        "qcow2",
        "-b",
        &url,
        &overlay.display().to_string(),
    ])?;
    qemu_img(&[
        "compare",
        "-f",
        "raw",
        "-F",
        "qcow2",
        &raw_s,
        &overlay.display().to_string(),
    ])?;
    ensure!(
        proxy.calls("COMMIT")? > 0,
        "QEMU sent no COMMIT through the proxy"
    );
    ensure!(
        proxy.calls("WRITE")? > 0 && proxy.calls("READ")? > 0,
        "no WRITE or READ seen"
    );
    Ok(())
}

#[test]
fn qemu_img_converts_to_and_from_the_dir_origin_on_port_111() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let proxy = on_111(2, format!("dir:{}", origin.path().display()))?;
    convert_round_trip(&proxy, origin.path())
}

#[test]
fn qemu_img_converts_through_two_proxies_to_ganesha() -> Result<()> {
    let g = Ganesha::start()?;
    let inner = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let up = format!(
        "nfs://{}:{}/export?mountport={}",
        inner.ip(),
        inner.port(),
        inner.port()
    );
    let outer = on_111(3, up)?;
    convert_round_trip(&outer, g.export_dir())
}
