//! A minimal synchronous ONC RPC client over TCP, for probes that the
//! libnfs tools cannot express (what exactly a server puts on the wire),
//! built on `gvfs_nfs`' sans-IO codec.
//!
//! One call per connection, every phase under [`CALL_TIMEOUT`], replies
//! capped at [`MAX_REPLY`] bytes; and raw calls as sent on the wire
//! ([`read_call`], [`send_call`]), for clients that pipeline calls and read
//! their replies late or never.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use gvfs_nfs::NfsRequest;
use gvfs_nfs::nfs3_types::nfs3::{READ3args, nfs_fh3};
use gvfs_nfs::record::{RecordLimits, RecordReader};
use gvfs_nfs::rpc::{self, Credentials};
use gvfs_nfs::xdr::{self, XdrReader};

/// Timeout of each phase of a call: connect, send, each read.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest reply accepted.
pub const MAX_REPLY: u32 = 1 << 20;

pub use gvfs_nfs::proc::{MOUNT_PROGRAM, NFS_PROGRAM};

static XID: AtomicU32 = AtomicU32::new(0x6776_1000);

/// Calls `prog`/`vers`/`proc_` at `addr` with XDR `args` and returns the
/// results of a successful reply (an RPC-level error is an `Err`).
pub fn call(
    addr: SocketAddr,
    prog: u32,
    vers: u32,
    proc_: u32,
    cred: &Credentials,
    args: &[u8],
) -> Result<Vec<u8>> {
    let xid = XID.fetch_add(1, Ordering::Relaxed);
    let mut record = rpc::call_record(xid, prog, vers, proc_, cred);
    record.extend_from_slice(args);
    let record = rpc::seal(record);
    let what = format!("RPC {prog}/{vers}/{proc_} to {addr}");
    let mut stream = TcpStream::connect_timeout(&addr, CALL_TIMEOUT)
        .with_context(|| format!("{what}: connecting"))?;
    stream.set_read_timeout(Some(CALL_TIMEOUT))?;
    stream.set_write_timeout(Some(CALL_TIMEOUT))?;
    stream
        .write_all(&record)
        .with_context(|| format!("{what}: sending"))?;
    let mut reader = RecordReader::new(RecordLimits {
        max_fragment: MAX_REPLY,
        max_record: MAX_REPLY,
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = stream
            .read(&mut buf)
            .with_context(|| format!("{what}: reading the reply"))?;
        if n == 0 {
            bail!("{what}: connection closed without a reply");
        }
        let mut input = &buf[..n];
        while !input.is_empty() {
            let used = reader.feed(input).map_err(|e| anyhow!("{what}: {e}"))?;
            input = &input[used..];
            if let Some(msg) = reader.take_record()
                && rpc::reply_xid(&msg) == Some(xid)
            {
                let results = rpc::parse_reply(&msg).map_err(|e| anyhow!("{what}: {e}"))?;
                return Ok(results.to_vec());
            }
        }
    }
}

/// MOUNT v3 MNT of `export` at `addr` as root; returns the root file handle.
pub fn mount(addr: SocketAddr, export: &str) -> Result<Vec<u8>> {
    let mut args = Vec::new();
    xdr::put_opaque(&mut args, export.as_bytes());
    let res = call(addr, MOUNT_PROGRAM, 3, 1, &Credentials::unix(0, 0), &args)?;
    let mut r = XdrReader::new(&res);
    let status = r.u32()?;
    if status != 0 {
        bail!("MNT {export} at {addr} failed with mountstat3 {status}");
    }
    Ok(r.opaque(64)?.to_vec())
}

/// One READDIR entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// File id (inode number).
    pub fileid: u64,
    /// Name as sent (not necessarily UTF-8).
    pub name: Vec<u8>,
    /// Cookie to continue after this entry.
    pub cookie: u64,
}

/// NFSv3 READDIR of directory `fh` at `addr` as root, following cookies to
/// the end; returns every entry exactly as the server sent it.
pub fn readdir(addr: SocketAddr, fh: &[u8]) -> Result<Vec<DirEntry>> {
    let mut entries = Vec::new();
    let mut cookie = 0u64;
    let mut verf = [0u8; 8];
    // Bounded: a server that never says eof fails the probe.
    for _ in 0..10_000 {
        let mut args = Vec::new();
        xdr::put_opaque(&mut args, fh);
        args.extend_from_slice(&cookie.to_be_bytes());
        args.extend_from_slice(&verf);
        xdr::put_u32(&mut args, 32 * 1024);
        let res = call(addr, NFS_PROGRAM, 3, 16, &Credentials::unix(0, 0), &args)?;
        let mut r = XdrReader::new(&res);
        let status = r.u32()?;
        if status != 0 {
            bail!("READDIR at {addr} failed with nfsstat3 {status}");
        }
        skip_post_op_attr(&mut r)?;
        let v = [r.u32()?, r.u32()?];
        verf[..4].copy_from_slice(&v[0].to_be_bytes());
        verf[4..].copy_from_slice(&v[1].to_be_bytes());
        while r.u32()? == 1 {
            let fileid = u64_(&mut r)?;
            let name = r.opaque(255)?.to_vec();
            cookie = u64_(&mut r)?;
            entries.push(DirEntry {
                fileid,
                name,
                cookie,
            });
        }
        if r.u32()? == 1 {
            return Ok(entries);
        }
    }
    bail!("READDIR at {addr} never reached eof")
}

fn u64_(r: &mut XdrReader<'_>) -> Result<u64> {
    let hi = r.u32()?;
    let lo = r.u32()?;
    Ok(u64::from(hi) << 32 | u64::from(lo))
}

/// Skips a `post_op_attr` (a bool, then 84 bytes of fattr3 when true).
fn skip_post_op_attr(r: &mut XdrReader<'_>) -> Result<()> {
    if r.u32()? == 1 {
        for _ in 0..21 {
            r.u32()?;
        }
    }
    Ok(())
}

/// A READ3 call of `count` bytes at `offset` of `fh` as root, as sent on
/// the wire (record mark included), for clients that pipeline raw calls.
pub fn read_call(xid: u32, fh: &nfs_fh3, offset: u64, count: u32) -> Vec<u8> {
    nfs_call(
        xid,
        &NfsRequest::Read(READ3args {
            file: fh.clone(),
            offset,
            count,
        }),
    )
}

/// NFSv3 call `req` as root with `xid`, as sent on the wire (record mark
/// included).
pub fn nfs_call(xid: u32, req: &NfsRequest) -> Vec<u8> {
    let cred = Credentials::unix(0, 0);
    let mut rec = rpc::call_record(xid, NFS_PROGRAM, 3, req.proc_() as u32, &cred);
    req.encode(&mut rec);
    rpc::seal(rec)
}

/// Sends NFSv3 call `req` with `xid` on `s` without waiting for a reply.
pub fn send_call(s: &mut impl Write, xid: u32, req: &NfsRequest) -> Result<()> {
    s.write_all(&nfs_call(xid, req))
        .with_context(|| format!("sending {}", req.proc_().name()))
}
