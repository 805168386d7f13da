//! Retransmissions and limits seen from the wire: a resent REMOVE is
//! answered from the duplicate-request cache (not run twice, which would
//! turn success into NFS3ERR_NOENT), connections beyond the limit wait, and
//! a TOML config file drives the proxy like the command line does.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs::libnfs::nfs_cat;
use gvfs::proxy::chain;
use gvfs::rpc_client;
use gvfs::{Ganesha, Proxy, ProxyArgs};
use gvfs_nfs::nfs3_types::nfs3::*;
use gvfs_nfs::rpc::{self, Credentials};
use gvfs_nfs::{NfsProc, NfsReply, NfsRequest};

fn connect(addr: SocketAddr) -> Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

fn send_call(s: &mut TcpStream, xid: u32, req: &NfsRequest) -> Result<()> {
    let mut rec = rpc::call_record(
        xid,
        100_003,
        3,
        req.proc_() as u32,
        &Credentials::unix(0, 0),
    );
    req.encode(&mut rec);
    s.write_all(&rpc::seal(rec))?;
    Ok(())
}

fn recv_reply(s: &mut TcpStream, p: NfsProc) -> Result<NfsReply> {
    let mut hdr = [0u8; 4];
    s.read_exact(&mut hdr)?;
    let mut body = vec![0; (u32::from_be_bytes(hdr) & 0x7FFF_FFFF) as usize];
    s.read_exact(&mut body)?;
    let results = rpc::parse_reply(&body).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(NfsReply::decode(p, results)?)
}

fn root_of(p: &Proxy) -> Result<nfs_fh3> {
    let fh = rpc_client::mount(p.addr(), "/export")?;
    Ok(nfs_fh3 {
        data: gvfs_nfs::nfs3_types::xdr_codec::Opaque::owned(fh),
    })
}

/// Sends the same REMOVE (same xid) twice, then once more on a new
/// connection, as a client does after a lost reply or a reconnect.
fn resent_remove_succeeds_each_time(p: &Proxy, origin: &std::path::Path) -> Result<()> {
    std::fs::write(origin.join("victim"), b"x")?;
    let req = NfsRequest::Remove(REMOVE3args {
        object: diropargs3 {
            dir: root_of(p)?,
            name: filename3::from(b"victim".to_vec()),
        },
    });
    let mut s = connect(p.addr())?;
    for _ in 0..2 {
        send_call(&mut s, 0x5151, &req)?;
        let r = recv_reply(&mut s, NfsProc::Remove)?;
        ensure!(
            r.status() == nfsstat3::NFS3_OK,
            "REMOVE replied {:?}",
            r.status()
        );
    }
    let mut s2 = connect(p.addr())?;
    send_call(&mut s2, 0x5151, &req)?;
    ensure!(
        recv_reply(&mut s2, NfsProc::Remove)?.status() == nfsstat3::NFS3_OK,
        "after reconnect"
    );
    ensure!(!origin.join("victim").exists(), "the file is still there");
    // A new xid is a new call: now the file is gone.
    send_call(&mut s2, 0x5152, &req)?;
    ensure!(recv_reply(&mut s2, NfsProc::Remove)?.status() == nfsstat3::NFS3ERR_NOENT);
    let st = p.status()?;
    ensure!(st["drc_hits"].as_u64() == Some(2), "status: {st}");
    Ok(())
}

#[test]
fn a_resent_remove_is_answered_not_rerun_on_the_dir_origin() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let p = Proxy::spawn(ProxyArgs::dir(origin.path()))?;
    resent_remove_succeeds_each_time(&p, origin.path())
}

#[test]
fn a_resent_remove_is_answered_not_rerun_through_a_chain_to_ganesha() -> Result<()> {
    let g = Ganesha::start()?;
    let proxies = chain(&g.upstream_url(), 2, &[])?;
    resent_remove_succeeds_each_time(proxies.last().context("no proxy")?, g.export_dir())
}

#[test]
fn connections_beyond_the_limit_wait_for_a_free_slot() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let p = Proxy::spawn(
        ProxyArgs::dir(origin.path())
            .arg("--max-connections")
            .arg("2"),
    )?;
    let null = NfsRequest::Null(gvfs_nfs::nfs3_types::xdr_codec::Void);
    let mut a = connect(p.addr())?;
    let mut b = connect(p.addr())?;
    for (i, s) in [&mut a, &mut b].into_iter().enumerate() {
        send_call(s, i as u32, &null)?;
        recv_reply(s, NfsProc::Null)?;
    }
    let mut c = connect(p.addr())?;
    c.set_read_timeout(Some(Duration::from_millis(700)))?;
    send_call(&mut c, 3, &null)?;
    let mut byte = [0u8; 1];
    let waited = c.read(&mut byte);
    ensure!(
        matches!(&waited, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "a third connection was served beyond the limit: {waited:?}"
    );
    drop(a);
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    recv_reply(&mut c, NfsProc::Null)
        .context("the waiting connection was not served after a slot freed")?;
    Ok(())
}

#[test]
fn a_toml_config_file_configures_the_proxy() -> Result<()> {
    let origin = tempfile::tempdir()?;
    std::fs::write(origin.path().join("hello"), b"from the config")?;
    let cfg = origin.path().join("proxy.toml");
    std::fs::write(
        &cfg,
        format!(
            "upstream = \"dir:{}\"\nexport = \"/images\"\nmax_in_flight = 8\nupstream_timeout_secs = 30\n",
            origin.path().display()
        ),
    )?;
    // The fixture passes --upstream on the command line; pass the config
    // and let the command line's --upstream point at the same directory,
    // so only the export name comes from the file.
    let p = Proxy::spawn(
        ProxyArgs::dir(origin.path())
            .arg("--config")
            .arg(cfg.display().to_string()),
    )?;
    let url = format!(
        "nfs://127.0.0.1/images/hello?version=3&nfsport={0}&mountport={0}",
        p.port()
    );
    ensure!(nfs_cat(&url)? == b"from the config");
    let st = p.status()?;
    ensure!(st["export"] == "/images", "status: {st}");
    Ok(())
}
