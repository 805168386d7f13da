//! Smoke tests of the fixtures against the real peers: nfs-ganesha behind
//! our portmapper, libnfs-utils and qemu-img as clients.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use gvfs_nfs::rpc::{self, Credentials};
use gvfs_testbed::data::{
    self, compare_bytes, compare_file_with, compare_files, random_bytes, write_random_file,
};
use gvfs_testbed::libnfs::{nfs_cat, nfs_cp, nfs_ls, nfs_ls_entries, nfs_ls_names, qemu_img};
use gvfs_testbed::portmap::{self, Portmapper};
use gvfs_testbed::rpc_client::{self, MOUNT_PROGRAM, NFS_PROGRAM};
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs, ganesha};

/// QEMU finds ganesha through the portmapper, which answers with the most
/// recently registered instance: the QEMU test runs alone (write lock)
/// while the other tests may share (read lock).
static PORTMAP_ORDER: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    PORTMAP_ORDER.read().unwrap_or_else(|e| e.into_inner())
}

const MIB: u64 = 1 << 20;

#[test]
fn ganesha_serves_files_to_libnfs() -> Result<()> {
    let _order = shared();
    let t = Instant::now();
    let g = Ganesha::start()?;
    eprintln!("ganesha started in {:?} at {}", t.elapsed(), g.url(""));

    let local = tempfile::tempdir()?;
    let src = local.path().join("big.bin");
    write_random_file(&src, 42, 5 * MIB)?;

    // Local -> NFS, NFS -> stdout.
    nfs_cp(src.to_str().context("utf-8 path")?, &g.url("big.bin"))?;
    let back = nfs_cat(&g.url("big.bin"))?;
    compare_bytes(&random_bytes(42, 5 * MIB as usize), &back)?;

    // The file landed in the export directory, byte for byte.
    compare_files(&src, &g.export_dir().join("big.bin"))?;

    // NFS -> local.
    let copy = local.path().join("copy.bin");
    nfs_cp(&g.url("big.bin"), copy.to_str().context("utf-8 path")?)?;
    compare_files(&src, &copy)?;

    // nfs-ls sees it with its size; nfs-ls leaves out "." and "..".
    fs::create_dir(g.export_dir().join("sub"))?;
    fs::write(g.export_dir().join("sub/with space"), b"hi\n")?;
    let text = nfs_ls(&g.url(""))?;
    let entries = nfs_ls_entries(&g.url(""))?;
    let big = entries
        .iter()
        .find(|e| e.name == "big.bin")
        .with_context(|| format!("big.bin not listed:\n{text}"))?;
    ensure!(big.size == 5 * MIB && !big.is_dir(), "{big:?}");
    ensure!(
        entries.iter().any(|e| e.name == "sub" && e.is_dir()),
        "{text}"
    );
    ensure!(
        !entries.iter().any(|e| e.name == "." || e.name == ".."),
        "{text}"
    );
    ensure!(nfs_ls_names(&g.url("sub"))? == ["with space"]);
    // A file below a subdirectory is reachable by URL.
    ensure!(nfs_cat(&g.url("sub/with space"))? == b"hi\n");

    // nfs-cp refuses to overwrite; errors carry the tool's stderr.
    let err = nfs_cp(src.to_str().context("utf-8 path")?, &g.url("big.bin"))
        .err()
        .context("nfs-cp overwrote an existing file")?;
    ensure!(format!("{err:#}").contains("NFS3ERR_EXIST"), "{err:#}");
    let err = nfs_cat(&g.url("missing"))
        .err()
        .context("nfs-cat of a missing file succeeded")?;
    ensure!(format!("{err:#}").contains("NFS3ERR_NOENT"), "{err:#}");
    Ok(())
}

#[test]
fn ganesha_readdir_on_the_wire_includes_dot_entries() -> Result<()> {
    let _order = shared();
    let g = Ganesha::start()?;
    fs::write(g.export_dir().join("f"), b"x")?;
    let fh = rpc_client::mount(SocketAddr::new(g.ip(), g.mount_port()), ganesha::EXPORT)?;
    let names: Vec<String> = rpc_client::readdir(g.nfs_addr(), &fh)?
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    // Ganesha 5.9 sends "." and ".." in NFSv3 READDIR (libnfs' nfs-ls hides them).
    let mut sorted = names.clone();
    sorted.sort();
    ensure!(sorted == [".", "..", "f"], "READDIR sent {names:?}");
    Ok(())
}

#[test]
fn two_ganesha_instances_at_once() -> Result<()> {
    let _order = shared();
    let (a, b) = (Ganesha::start()?, Ganesha::start()?);
    ensure!(a.nfs_port() != b.nfs_port() && a.mount_port() != b.mount_port());
    ensure!(a.export_dir() != b.export_dir());
    fs::write(a.export_dir().join("only-a"), b"a")?;
    fs::write(b.export_dir().join("only-b"), b"b")?;
    ensure!(nfs_ls_names(&a.url(""))? == ["only-a"]);
    ensure!(nfs_ls_names(&b.url(""))? == ["only-b"]);
    ensure!(nfs_cat(&b.url("only-b"))? == b"b");

    let pm = Portmapper::ensure()?;
    if let Some(regs) = pm.registrations() {
        for g in [&a, &b] {
            let pid = g.pid();
            ensure!(
                regs.iter().any(|r| r.pid == pid
                    && r.prog == NFS_PROGRAM
                    && r.port() == Some(g.nfs_port())),
                "no NFS registration of pid {pid:?} in {regs:#?}"
            );
        }
    }

    // Stopping one leaves the other served and registered.
    let t = Instant::now();
    drop(a);
    eprintln!("ganesha stopped in {:?}", t.elapsed());
    ensure!(nfs_cat(&b.url("only-b"))? == b"b");
    if let Some(regs) = pm.registrations() {
        ensure!(
            regs.iter()
                .any(|r| r.pid == b.pid() && r.port() == Some(b.nfs_port())),
            "{regs:#?}"
        );
    }
    Ok(())
}

#[test]
fn ganesha_restart_keeps_ports_and_files() -> Result<()> {
    let _order = shared();
    let mut g = Ganesha::start()?;
    let (nfs, mnt, pid) = (g.nfs_port(), g.mount_port(), g.pid());
    let content = random_bytes(9, 300_000);
    fs::write(g.export_dir().join("kept"), &content)?;
    let t = Instant::now();
    g.restart()?;
    eprintln!("ganesha restarted in {:?}", t.elapsed());
    ensure!(g.nfs_port() == nfs && g.mount_port() == mnt && g.pid() != pid);
    compare_bytes(&content, &nfs_cat(&g.url("kept"))?)?;
    // And it still takes writes after the restart.
    let local = tempfile::tempdir()?;
    let src = local.path().join("new");
    write_random_file(&src, 10, MIB)?;
    nfs_cp(src.to_str().context("utf-8 path")?, &g.url("new"))?;
    compare_files(&src, &g.export_dir().join("new"))?;
    Ok(())
}

/// QEMU's nfs:// URLs take no ports: it asks PORTMAP v2 GETPORT at HOST:111
/// for MOUNT and NFS. Our portmapper answers with the most recently started
/// live ganesha, so with one instance running this works directly.
#[test]
fn qemu_img_reaches_ganesha_through_the_portmapper() -> Result<()> {
    let _alone = PORTMAP_ORDER.write().unwrap_or_else(|e| e.into_inner());
    let g = Ganesha::start()?;
    let pm = Portmapper::ensure()?;
    ensure!(pm.tcp_port_of(NFS_PROGRAM, 3)? == g.nfs_port());
    ensure!(pm.tcp_port_of(MOUNT_PROGRAM, 3)? == g.mount_port());

    let seen = pm
        .calls()
        .and_then(|c| c.last().map(|c| c.seq))
        .unwrap_or(0);
    let url = "nfs://127.0.0.1/export/disk.qcow2";
    qemu_img(&["create", "-f", "qcow2", url, "64M"])?;
    let info = qemu_img(&["info", url])?;
    ensure!(
        info.contains("file format: qcow2") && info.contains("virtual size: 64 MiB"),
        "{info}"
    );
    let local = fs::read(g.export_dir().join("disk.qcow2"))?;
    ensure!(local.starts_with(b"QFI\xfb"), "not a qcow2 header");

    // Convert a raw image in through NFS and check it came out intact.
    let dir = tempfile::tempdir()?;
    let raw = dir.path().join("raw.img");
    data::write_sparse_file(&raw, 8 * MIB, 5, &[(0, 4096), (3 * MIB, 70_000)])?;
    qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "raw",
        raw.to_str().context("utf-8 path")?,
        "nfs://127.0.0.1/export/raw.img",
    ])?;
    compare_files(&raw, &g.export_dir().join("raw.img"))?;

    // What QEMU asked: PORTMAP v2 GETPORT over TCP for MOUNT and NFS.
    if let Some(calls) = pm.calls() {
        let qemu: Vec<_> = calls
            .iter()
            .filter(|c| c.seq > seen && c.transport != "unix")
            .collect();
        for prog in [MOUNT_PROGRAM, NFS_PROGRAM] {
            let asked = qemu.iter().any(|c| {
                c.transport == "tcp"
                    && c.vers == 2
                    && c.proc_ == 3
                    && c.summary.contains(&format!("prog: {prog},"))
            });
            ensure!(
                asked,
                "QEMU did not ask PORTMAP v2 GETPORT for {prog} over TCP: {qemu:#?}"
            );
        }
    }
    Ok(())
}

#[test]
fn portmapper_answers_v2_and_rpcbind_over_tcp_and_udp() -> Result<()> {
    let pm = Portmapper::ensure()?;
    ensure!(
        std::ptr::eq(pm, Portmapper::ensure()?),
        "ensure() started a second portmapper"
    );
    portmap::null_call(pm.addr())?;
    ensure!(portmap::getport(pm.addr(), 0x2000_0042, 1, 6)? == 0);

    // rpcbind v4 GETADDR of an unregistered program: the empty string.
    let mut args = Vec::new();
    for v in [0x2000_0042u32, 1] {
        gvfs_nfs::xdr::put_u32(&mut args, v);
    }
    for s in ["tcp", "", ""] {
        gvfs_nfs::xdr::put_opaque(&mut args, s.as_bytes());
    }
    let res = rpc_client::call(pm.addr(), 100_000, 4, 3, &Credentials::None, &args)?;
    ensure!(res == [0, 0, 0, 0], "{res:?}");
    // An unknown procedure is PROC_UNAVAIL.
    let err = rpc_client::call(pm.addr(), 100_000, 3, 8, &Credentials::None, &[])
        .err()
        .context("proc 8 answered")?;
    ensure!(format!("{err:#}").contains("ProcUnavail"), "{err:#}");

    // UDP: a NULL call in one datagram.
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    sock.set_read_timeout(Some(Duration::from_secs(3)))?;
    let call = rpc::seal(rpc::call_record(77, 100_000, 2, 0, &Credentials::None));
    sock.send_to(&call[4..], pm.addr())?;
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf)?;
    ensure!(rpc::reply_xid(&buf[..n]) == Some(77));
    ensure!(
        rpc::parse_reply(&buf[..n])
            .map_err(anyhow::Error::from)?
            .is_empty()
    );
    Ok(())
}

#[test]
fn data_helpers_compare_files_with_offsets() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let p = dir.path().join("f");
    write_random_file(&p, 3, 100_000)?;
    compare_file_with(&random_bytes(3, 100_000), &p)?;
    let mut other = random_bytes(3, 100_000);
    other[77_777] ^= 0xff;
    let err = compare_file_with(&other, &p)
        .err()
        .context("difference not found")?;
    ensure!(format!("{err:#}").contains("offset 77777"), "{err:#}");
    Ok(())
}

/// Needs the proxy binary: `cargo build --workspace --bins` first.
#[test]
fn proxy_fixture_spawns_serves_and_terminates() -> Result<()> {
    let _order = shared();
    let dir = tempfile::tempdir()?;
    let content = random_bytes(11, 200_000);
    fs::write(dir.path().join("local.bin"), &content)?;
    let ctl = dir.path().join("ctl.sock");
    let mut p = Proxy::spawn(ProxyArgs::dir(dir.path()).control(&ctl))?;
    ensure!(p.control_path() == ctl);
    ensure!(
        p.addr().ip() == Ipv4Addr::LOCALHOST && p.port() != 0,
        "{}",
        p.addr()
    );
    compare_bytes(&content, &nfs_cat(&p.url("local.bin"))?)?;

    // In front of ganesha.
    let g = Ganesha::start()?;
    fs::write(g.export_dir().join("remote.bin"), &content)?;
    let q = Proxy::spawn(ProxyArgs::new(g.upstream_url()).export("/vm"))?;
    ensure!(
        q.control_path().exists(),
        "no control socket at {}",
        q.control_path().display()
    );
    ensure!(q.url("remote.bin").starts_with(&format!(
        "nfs://127.0.0.1/vm/remote.bin?version=3&nfsport={}",
        q.port()
    )));
    compare_bytes(&content, &nfs_cat(&q.url("remote.bin"))?)?;

    let status = p.terminate()?;
    ensure!(
        status.success(),
        "proxy exited with {status}; output:\n{}",
        p.output()
    );
    ensure!(p.output().contains("listening on"), "{}", p.output());
    Ok(())
}
