//! Bad input, each a test: what a broken or hostile peer sends, what an
//! unreachable upstream does, and what a user can get wrong on the command
//! line. The proxy must answer with the right RPC error or close the
//! connection, allocate nothing large, never die, and say clearly what is
//! wrong.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use gvfs_nfs::rpc::{self, Credentials, ReplyError, ReplyStatus, auth_stat};
use gvfs_nfs::xdr;
use gvfs_testbed::libnfs::nfs_cat;
use gvfs_testbed::proxy::{proxy_binary, unreachable_upstream_args};
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};

/// A raw RPC connection that sends whatever bytes a test wants.
struct Raw(TcpStream);

impl Raw {
    fn connect(addr: SocketAddr) -> Result<Self> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Self(s))
    }

    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.0.write_all(bytes).context("sending")
    }

    /// Sends `msg` as one record.
    fn send_record(&mut self, msg: &[u8]) -> Result<()> {
        let mut out = gvfs_nfs::record::frame(msg.len()).to_vec();
        out.extend_from_slice(msg);
        self.send(&out)
    }

    /// Reads one reply record; `None` when the proxy closed the connection.
    fn recv(&mut self) -> Result<Option<Vec<u8>>> {
        let mut hdr = [0u8; 4];
        match self.0.read_exact(&mut hdr) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e).context("reading a reply"),
        }
        let len = u32::from_be_bytes(hdr) & 0x7FFF_FFFF;
        ensure!(len < 4 << 20, "reply of {len} bytes");
        let mut body = vec![0; len as usize];
        self.0.read_exact(&mut body)?;
        Ok(Some(body))
    }

    /// Sends a call and returns how the reply parsed.
    fn call(
        &mut self,
        xid: u32,
        prog: u32,
        vers: u32,
        proc_: u32,
        args: &[u8],
    ) -> Result<Result<Vec<u8>, ReplyError>> {
        let mut rec = rpc::call_record(xid, prog, vers, proc_, &Credentials::unix(0, 0));
        rec.extend_from_slice(args);
        self.send(&rpc::seal(rec))?;
        let reply = self
            .recv()?
            .context("connection closed instead of a reply")?;
        ensure!(rpc::reply_xid(&reply) == Some(xid), "reply to another xid");
        Ok(rpc::parse_reply(&reply).map(<[u8]>::to_vec))
    }
}

fn accepted(status: ReplyStatus) -> Result<Vec<u8>, ReplyError> {
    Err(ReplyError::Accepted(status))
}

fn dir_proxy() -> Result<(tempfile::TempDir, Proxy)> {
    let origin = tempfile::tempdir()?;
    std::fs::write(origin.path().join("f"), b"hello")?;
    let p = Proxy::spawn(ProxyArgs::dir(origin.path()))?;
    Ok((origin, p))
}

fn rss_kib(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("bad VmRSS")?
        .parse()?)
}

/// The proxy still answers a NULL call on a fresh connection.
fn still_serves(p: &Proxy) -> Result<()> {
    let r = Raw::connect(p.addr())?.call(77, 100_003, 3, 0, &[])?;
    ensure!(r == Ok(vec![]), "NULL after bad input: {r:?}");
    Ok(())
}

#[test]
fn oversized_fragment_header_closes_the_connection_without_allocating() -> Result<()> {
    let (_o, p) = dir_proxy()?;
    let pid = p.pid().context("no pid")?;
    let before = rss_kib(pid)?;
    for header in [0xFFFF_FFFFu32, 0x7FFF_FFFF, 0x8000_0000 | (64 << 20)] {
        let mut raw = Raw::connect(p.addr())?;
        raw.send(&header.to_be_bytes())?;
        // A few bytes of "body" that never complete the announced length.
        raw.send(&[0u8; 1024])?;
        ensure!(
            raw.recv()?.is_none(),
            "connection stayed open after a {header:#x} header"
        );
    }
    let after = rss_kib(pid)?;
    ensure!(
        after < before + 32 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    let st = p.status()?;
    ensure!(
        st.connections.counts.closed_oversized == 3,
        "status: {st:?}"
    );
    still_serves(&p)
}

#[test]
fn fragments_adding_up_past_the_record_cap_close_the_connection() -> Result<()> {
    let (_o, p) = dir_proxy()?;
    let mut raw = Raw::connect(p.addr())?;
    let chunk = vec![0u8; 512 * 1024];
    let mut closed = false;
    for _ in 0..8 {
        // Not-last fragments of 512 KiB each: the record never ends.
        if raw.send(&(512u32 * 1024).to_be_bytes()).is_err() || raw.send(&chunk).is_err() {
            closed = true;
            break;
        }
    }
    ensure!(
        closed || raw.recv()?.is_none(),
        "connection stayed open past the record cap"
    );
    still_serves(&p)
}

#[test]
fn truncated_and_garbage_arguments_get_garbage_args() -> Result<()> {
    let (_o, p) = dir_proxy()?;
    let mut raw = Raw::connect(p.addr())?;
    // GETATTR with a handle announced as 32 bytes but only 10 sent.
    let mut args = Vec::new();
    xdr::put_u32(&mut args, 32);
    args.extend_from_slice(&[1; 10]);
    ensure!(raw.call(1, 100_003, 3, 1, &args)? == accepted(ReplyStatus::GarbageArgs));
    // A handle longer than NFSv3's 64 bytes.
    let mut args = Vec::new();
    xdr::put_opaque(&mut args, &[7; 65]);
    ensure!(raw.call(2, 100_003, 3, 1, &args)? == accepted(ReplyStatus::GarbageArgs));
    // A forged 4 GiB name length in LOOKUP.
    let mut args = Vec::new();
    xdr::put_opaque(&mut args, &[1; 28]);
    xdr::put_u32(&mut args, u32::MAX);
    ensure!(raw.call(3, 100_003, 3, 3, &args)? == accepted(ReplyStatus::GarbageArgs));
    // Trailing garbage after valid arguments, and a bad enum (stable_how = 9).
    let mut args = Vec::new();
    xdr::put_opaque(&mut args, &[1; 28]);
    args.extend_from_slice(&[0xEE; 5]);
    ensure!(raw.call(4, 100_003, 3, 1, &args)? == accepted(ReplyStatus::GarbageArgs));
    let mut args = Vec::new();
    xdr::put_opaque(&mut args, &[1; 28]);
    for v in [0u32, 0, 4, 9, 4] {
        xdr::put_u32(&mut args, v);
    }
    args.extend_from_slice(b"data");
    ensure!(raw.call(5, 100_003, 3, 7, &args)? == accepted(ReplyStatus::GarbageArgs));
    // MOUNT with an over-long path.
    let mut args = Vec::new();
    xdr::put_opaque(&mut args, &[b'a'; 2000]);
    ensure!(raw.call(6, 100_005, 3, 1, &args)? == accepted(ReplyStatus::GarbageArgs));
    // A record too short to be a call is dropped; the connection goes on.
    raw.send_record(&[1, 2, 3])?;
    ensure!(raw.call(7, 100_003, 3, 0, &[])? == Ok(vec![]));
    still_serves(&p)
}

#[test]
fn unknown_program_version_and_procedure_get_their_rpc_errors() -> Result<()> {
    let (_o, p) = dir_proxy()?;
    let mut raw = Raw::connect(p.addr())?;
    ensure!(
        raw.call(1, 100_227, 3, 0, &[])? == accepted(ReplyStatus::ProgUnavail),
        "unknown program"
    );
    for vers in [2, 4] {
        ensure!(
            raw.call(2, 100_003, vers, 0, &[])?
                == accepted(ReplyStatus::ProgMismatch { low: 3, high: 3 }),
            "NFS v{vers}"
        );
    }
    ensure!(
        raw.call(3, 100_005, 1, 0, &[])? == accepted(ReplyStatus::ProgMismatch { low: 3, high: 3 }),
        "MOUNT v1"
    );
    ensure!(
        raw.call(4, 100_000, 3, 0, &[])? == accepted(ReplyStatus::ProgMismatch { low: 2, high: 2 }),
        "PORTMAP v3"
    );
    ensure!(
        raw.call(5, 100_003, 3, 22, &[])? == accepted(ReplyStatus::ProcUnavail),
        "NFS proc 22"
    );
    ensure!(
        raw.call(6, 100_005, 3, 9, &[])? == accepted(ReplyStatus::ProcUnavail),
        "MOUNT proc 9"
    );
    ensure!(
        raw.call(7, 100_000, 2, 5, &[])? == accepted(ReplyStatus::ProcUnavail),
        "PORTMAP CALLIT"
    );
    // The gvfs extension program: versions 1 (what proxies before HELLO
    // speak) and 2.
    let ext = gvfs_ext::PROGRAM;
    ensure!(
        raw.call(8, ext, 3, 0, &[])? == accepted(ReplyStatus::ProgMismatch { low: 1, high: 2 }),
        "extension v3"
    );
    ensure!(
        raw.call(9, ext, 1, 0, &[])? == Ok(vec![]),
        "extension v1 NULL"
    );
    ensure!(
        raw.call(10, ext, 1, gvfs_ext::PROC_HELLO, &[])? == accepted(ReplyStatus::ProcUnavail),
        "HELLO in version 1"
    );
    let mut all = Vec::new();
    xdr::put_u32(&mut all, u32::MAX);
    let mut agreed = Vec::new();
    xdr::put_u32(&mut agreed, gvfs_ext::Caps::ALL.0);
    ensure!(
        raw.call(11, ext, 2, gvfs_ext::PROC_HELLO, &all)? == Ok(agreed),
        "HELLO answers the capabilities both speak"
    );
    ensure!(
        raw.call(12, ext, 2, gvfs_ext::PROC_HELLO, &[])? == accepted(ReplyStatus::GarbageArgs),
        "HELLO without its argument"
    );
    // RPC version 3 is denied with RPC_MISMATCH.
    let mut msg = Vec::new();
    for v in [8u32, 0, 3, 100_003, 3, 0, 0, 0, 0, 0] {
        xdr::put_u32(&mut msg, v);
    }
    raw.send_record(&msg)?;
    let reply = raw.recv()?.context("no reply to RPC v3")?;
    ensure!(rpc::parse_reply(&reply) == Err(ReplyError::Denied(ReplyStatus::RpcMismatch)));
    // AUTH_UNIX with 17 groups is a bad credential; AUTH_DES is too weak.
    let mut body = Vec::new();
    for v in [0u32, 0, 0, 0, 17] {
        xdr::put_u32(&mut body, v);
    }
    body.extend(std::iter::repeat_n(0u8, 17 * 4));
    let mut msg = Vec::new();
    for v in [9u32, 0, 2, 100_003, 3, 0, 1] {
        xdr::put_u32(&mut msg, v);
    }
    xdr::put_opaque(&mut msg, &body);
    xdr::put_u32(&mut msg, 0);
    xdr::put_u32(&mut msg, 0);
    raw.send_record(&msg)?;
    let reply = raw.recv()?.context("no reply to a bad credential")?;
    ensure!(
        rpc::parse_reply(&reply)
            == Err(ReplyError::Denied(ReplyStatus::AuthError(
                auth_stat::BADCRED
            )))
    );
    let mut msg = Vec::new();
    for v in [10u32, 0, 2, 100_003, 3, 0, 3, 0, 0, 0] {
        xdr::put_u32(&mut msg, v);
    }
    raw.send_record(&msg)?;
    let reply = raw.recv()?.context("no reply to AUTH_DES")?;
    ensure!(
        rpc::parse_reply(&reply)
            == Err(ReplyError::Denied(ReplyStatus::AuthError(
                auth_stat::TOOWEAK
            )))
    );
    let st = p.status()?;
    ensure!(st.front.rpc_errors >= 9, "status: {st:?}");
    still_serves(&p)
}

#[test]
fn upstream_down_then_back_delays_the_client_without_an_error() -> Result<()> {
    let mut g = Ganesha::start()?;
    std::fs::write(g.export_dir().join("f"), b"still here")?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    ensure!(nfs_cat(&p.url("f"))? == b"still here");
    g.stop()?;
    let url = p.url("f");
    let reader = std::thread::spawn(move || nfs_cat(&url));
    std::thread::sleep(Duration::from_secs(2));
    ensure!(
        !reader.is_finished(),
        "the read finished while the upstream was down"
    );
    g.restart()?;
    let got = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    ensure!(
        got == b"still here",
        "read after the outage returned {got:?}"
    );
    let st = p.status()?;
    ensure!(
        st.upstream_client.as_ref().map_or(0, |u| u.connects) >= 2,
        "no reconnect seen: {st:?}"
    );
    Ok(())
}

#[test]
fn upstream_never_back_gives_a_clean_error_and_the_proxy_lives_on() -> Result<()> {
    let mut g = Ganesha::start()?;
    std::fs::write(g.export_dir().join("f"), b"x")?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).upstream_timeout(3))?;
    ensure!(nfs_cat(&p.url("f"))? == b"x");
    g.stop()?;
    let start = Instant::now();
    let err = match nfs_cat(&p.url("f")) {
        Ok(bytes) => bail!("read succeeded with the upstream gone: {bytes:?}"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(
        start.elapsed() < Duration::from_secs(60),
        "the error took {:?}",
        start.elapsed()
    );
    eprintln!("client saw: {err}");
    still_serves(&p)?;
    let st = p.status()?;
    ensure!(st.front.service_errors >= 1, "status: {st:?}");
    ensure!(
        p.output().contains("unavailable"),
        "no log line naming the outage:\n{}",
        p.output()
    );
    Ok(())
}

/// Runs gvfs-proxy with `args`, expecting it to exit non-zero at once with
/// one error line containing `expect`.
fn refuses(args: &[&str], expect: &str) -> Result<()> {
    let mut cmd = Command::new(proxy_binary()?);
    cmd.args(args);
    let out = gvfs_testbed::process::run(&mut cmd, Duration::from_secs(30))?;
    let err = out.stderr_text();
    ensure!(
        !out.status.success(),
        "gvfs-proxy {args:?} started; stderr: {err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("error:"))
        .with_context(|| format!("no error line in {err:?}"))?;
    ensure!(
        line.starts_with("gvfs-proxy: error:") && line.contains(expect),
        "error line {line:?} lacks {expect:?}"
    );
    Ok(())
}

#[test]
fn command_line_mistakes_are_one_line_errors() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let dir = format!("dir:{}", origin.path().display());
    refuses(
        &["--listen", "127.0.0.1:0", "--upstream", "ftp://host/x"],
        "bad upstream",
    )?;
    refuses(
        &["--listen", "127.0.0.1:0", "--upstream", "nfs://host"],
        "bad nfs:// URL",
    )?;
    refuses(
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "dir:/nonexistent/gvfs-test",
        ],
        "/nonexistent/gvfs-test",
    )?;
    let file = origin.path().join("plain-file");
    std::fs::write(&file, b"")?;
    refuses(
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &format!("dir:{}", file.display()),
        ],
        "plain-file",
    )?;
    refuses(
        &["--listen", "0.0.0.0:0", "--upstream", &dir],
        "--allow-remote",
    )?;
    refuses(
        &["--listen", "not-an-address", "--upstream", &dir],
        "bad listen address",
    )?;
    let taken = TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port();
    refuses(
        &["--listen", &format!("127.0.0.1:{port}"), "--upstream", &dir],
        "in use",
    )?;
    // Nothing listens on the upstream's port: the upstream check fails fast.
    let unreachable = unreachable_upstream_args()?;
    let args: Vec<&str> = unreachable.iter().map(String::as_str).collect();
    refuses(&args, "upstream")?;
    let cfg = origin.path().join("bad.toml");
    std::fs::write(&cfg, "listen = 5\n")?;
    refuses(&["--config", &cfg.display().to_string()], "bad config file")?;
    refuses(
        &["--config", "/nonexistent/gvfs.toml"],
        "cannot read config file",
    )?;
    Ok(())
}

#[test]
fn unreadable_directory_is_refused_for_a_non_root_user() -> Result<()> {
    // As root every directory is readable: run the proxy as nobody.
    let setpriv = which("setpriv").context("setpriv (util-linux) runs the proxy as nobody")?;
    let origin = tempfile::tempdir()?;
    let locked = origin.path().join("locked");
    std::fs::create_dir(&locked)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(origin.path(), std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700))?;
    let mut cmd = Command::new(setpriv);
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(proxy_binary()?)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--control",
            "/tmp/gvfs-test-nobody.sock",
            "--upstream",
        ])
        .arg(format!("dir:{}", locked.display()));
    let out = gvfs_testbed::process::run(&mut cmd, Duration::from_secs(30))?;
    ensure!(!out.status.success(), "started on an unreadable directory");
    ensure!(
        out.stderr_text().contains("locked"),
        "stderr: {}",
        out.stderr_text()
    );
    Ok(())
}

fn which(name: &str) -> Result<std::path::PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .context("not found")
}
