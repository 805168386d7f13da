//! TLS tunnels between proxies, through the real binaries: certificates
//! from `gvfsctl ca`, a chain `client proxy -> gvfs:// -> image-server proxy
//! -> nfs-ganesha` used by libnfs and QEMU, every refusal the tunnel must
//! make (the refusing process stays up), identity mapping seen in file
//! ownership at the origin, the RFC 9289 STARTTLS probe, and a 20 s WAN
//! outage in the middle of a large read and of a large write.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gvfs_nfs::net::stream::RecordStream;
use gvfs_nfs::record::RecordLimits;
use gvfs_nfs::rpc::{self, Credentials};
use gvfs_nfs::xdr::{self, XdrReader};
use gvfs_testbed::data::{compare_files, write_random_file, write_sparse_file};
use gvfs_testbed::libnfs::{nfs_cat, nfs_cp, qemu_img};
use gvfs_testbed::site::Pki;
use gvfs_testbed::{Origin, Proxy, ProxyArgs, Site, Tier};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

const MIB: u64 = 1 << 20;

fn with_files(f: gvfs_tunnel::TlsFiles, p: ProxyArgs) -> ProxyArgs {
    p.tls_files(&f.cert, &f.key, &f.ca)
}

/// The image-server proxy: `args` (in front of its upstream), accepting
/// TLS peers.
fn image_server(pki: &Pki, args: ProxyArgs) -> Result<(Proxy, SocketAddr)> {
    let args = pki
        .args("image-server", args)
        .listen_tls(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
    let p = Proxy::spawn(args)?;
    let tls = p
        .stats()?
        .status
        .listen_tls
        .context("no listen_tls in status")?
        .parse()?;
    Ok((p, tls))
}

fn gvfs_url(tls: SocketAddr) -> String {
    format!("gvfs://{tls}/export?name=image-server")
}

#[test]
fn a_chain_over_tls_serves_libnfs_and_qemu_byte_for_byte() -> Result<()> {
    let listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 31)), 111);
    let site = Site::builder(Origin::Ganesha)
        .pki()
        .node(Tier::new().listen(listen))
        .start()?;
    let (server, client) = (site.image_server(), site.node(0)?);
    // libnfs: write through the tunnel, read back, compare at the origin.
    let local = tempfile::tempdir()?;
    let src = local.path().join("src.bin");
    write_random_file(&src, 4, 24 * MIB + 777)?;
    nfs_cp(&src.display().to_string(), &client.url("img.bin"))?;
    compare_files(&src, &site.origin_dir().join("img.bin")).context("at ganesha")?;
    let back = local.path().join("back.bin");
    nfs_cp(&client.url("img.bin"), &back.display().to_string())?;
    compare_files(&src, &back).context("read back through the tunnel")?;
    // QEMU: a qcow2 written and read through the tunnel.
    let raw = local.path().join("disk.raw");
    write_sparse_file(&raw, 64 * MIB, 5, &[(0, 65_536), (9 * MIB + 512, 2 * MIB)])?;
    let url = format!("nfs://{}/export/disk.qcow2", client.ip());
    let raw_s = raw.display().to_string();
    qemu_img(&["convert", "-f", "raw", "-O", "qcow2", &raw_s, &url])?;
    qemu_img(&["check", &url])?;
    qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &raw_s, &url])?;
    ensure!(
        site.origin_dir().join("disk.qcow2").is_file(),
        "the qcow2 did not land at ganesha"
    );
    ensure!(
        server.stats()?.status.connections.counts.tls_accepted >= 2,
        "no TLS peers counted"
    );
    ensure!(
        server.stats()?.status.tls_name.as_deref() == Some("image-server"),
        "status: {:?}",
        server.status()?
    );
    Ok(())
}

/// A client proxy that must fail to start: its check of the upstream is
/// refused by TLS. Returns its error output.
fn refused_client(args: ProxyArgs) -> Result<String> {
    match Proxy::spawn(args) {
        Ok(p) => bail!("the proxy started:\n{}", p.output()),
        Err(e) => Ok(format!("{e:#}")),
    }
}

#[test]
fn bad_certificates_and_wrong_protocols_are_refused_and_the_server_stays_up() -> Result<()> {
    let pki = Pki::new(&[])?;
    let rogue = Pki::new(&[])?;
    pki.issue("image-server")?;
    pki.issue("node1")?;
    pki.issue_expired("stale")?;
    rogue.issue("intruder")?;
    rogue.issue("image-server")?;
    let site = tempfile::tempdir()?;
    std::fs::write(site.path().join("f"), b"secret")?;
    let origin = format!("dir:{}", site.path().display());
    let (server, tls) = image_server(&pki, ProxyArgs::new(origin.clone()))?;
    let mut refusals = 0;

    let rt = tokio::runtime::Runtime::new()?;
    // Unknown CA: a certificate the site CA did not sign (a hand-made
    // client: gvfs-proxy itself refuses to start with it, below).
    let intruder = gvfs_tunnel::TlsFiles {
        ca: pki.files("node1").ca,
        ..rogue.files("intruder")
    };
    let got = rt.block_on(tls_null_call(tls, raw_client_config(&intruder)?));
    ensure!(got.is_err(), "served a certificate from another CA");
    refusals += 1;
    // Expired certificate, likewise.
    let got = rt.block_on(tls_null_call(tls, raw_client_config(&pki.files("stale"))?));
    ensure!(got.is_err(), "served an expired certificate");
    refusals += 1;
    // gvfs-proxy checks its own certificate at start, with a clear message.
    let e = refused_client(with_files(intruder, ProxyArgs::new(gvfs_url(tls))))?;
    ensure!(e.contains("intruder.pem"), "unknown CA at start: {e}");
    let e = refused_client(pki.args("stale", ProxyArgs::new(gvfs_url(tls))))?;
    ensure!(e.contains("expired"), "expired at start: {e}");
    // Wrong server name: the server's certificate is not for this name.
    let url = format!("gvfs://{tls}/export?name=someone-else");
    let e = refused_client(pki.args("node1", ProxyArgs::new(url)))?;
    ensure!(e.contains("upstream"), "wrong name: {e}");
    // A server whose certificate the site CA did not sign.
    let (rogue_server, rogue_tls) = image_server(&rogue, ProxyArgs::new(origin))?;
    let e = refused_client(pki.args("node1", ProxyArgs::new(gvfs_url(rogue_tls))))?;
    ensure!(e.contains("upstream"), "rogue server: {e}");
    drop(rogue_server);

    // No client certificate at all.
    let anonymous = client_config(&pki, None)?;
    let got = rt.block_on(tls_null_call(tls, anonymous.clone()));
    ensure!(got.is_err(), "served a client with no certificate");
    refusals += 1;
    // Plain RPC to the TLS port: no reply, connection closed.
    let plain = rt.block_on(async {
        let mut s = tokio::net::TcpStream::connect(tls).await?;
        null_call(&mut s).await
    });
    ensure!(plain.is_err(), "answered plain RPC on the TLS port");
    refusals += 1;
    // TLS to the plain port.
    let hello = rt.block_on(tls_null_call(
        server.addr(),
        client_config(&pki, Some("node1"))?,
    ));
    ensure!(
        hello.is_err(),
        "a TLS handshake succeeded on the plain port"
    );
    refusals += 1;

    // Nothing was served, the server counted the refusals and still works
    // for good peers.
    ensure!(
        server.stats()?.status.connections.counts.tls_refused >= refusals,
        "status: {:?}",
        server.status()?
    );
    let good = Proxy::spawn(pki.args("node1", ProxyArgs::new(gvfs_url(tls))))?;
    // node1 has no mapping rule, so it is squashed to nobody: reading a
    // world-readable file still works.
    ensure!(nfs_cat(&good.url("f"))? == b"secret");
    ensure!(
        server.output().contains("refused a connection"),
        "no refusal logged:\n{}",
        server.output()
    );
    Ok(())
}

#[test]
fn silent_sockets_on_the_tls_port_do_not_keep_a_peer_out() -> Result<()> {
    let pki = Pki::new(&["image-server", "node1"])?;
    let site = tempfile::tempdir()?;
    std::fs::write(site.path().join("f"), b"through the crowd")?;
    let origin = format!("dir:{}", site.path().display());
    let (server, tls) = image_server(
        &pki,
        ProxyArgs::new(origin)
            .max_connections(8)
            .map_peer("node1", "pass"),
    )?;
    // A hundred sockets that never start a handshake, far more than the
    // served connections and than the budget of new ones.
    let mut silent = Vec::new();
    for _ in 0..100 {
        silent.push(std::net::TcpStream::connect(tls)?);
    }
    // Health checks: connect, close, send nothing.
    for _ in 0..5 {
        drop(std::net::TcpStream::connect(tls)?);
    }
    // A client proxy checks its upstream within twice --connect-timeout at
    // start, so it starts only if its handshake is not held up.
    let client = Proxy::spawn(pki.args("node1", ProxyArgs::new(gvfs_url(tls)).connect_timeout(3)))?;
    ensure!(nfs_cat(&client.url("f"))? == b"through the crowd");
    let st = server.stats()?;
    let conns = &st.status.connections.counts;
    ensure!(
        conns.evicted_pending >= 30 && conns.tls_accepted >= 1,
        "status: {st}"
    );
    // Nobody was refused: silence is not a failed handshake.
    ensure!(conns.tls_refused == 0, "status: {st}");
    let log = server.output();
    ensure!(
        !log.contains("refused a connection"),
        "a health check or silent socket was logged as a refused peer:\n{log}"
    );
    drop(silent);
    Ok(())
}

/// Runs `gvfs-proxy` with `args` until it exits (it must, at start-up);
/// returns whether it exited with the TLS code (5), and its error output.
fn start_up_failure(args: ProxyArgs) -> Result<(bool, String)> {
    let control = tempfile::tempdir()?;
    let mut cmd = std::process::Command::new(gvfs_testbed::proxy::proxy_binary()?);
    cmd.args(args.control(control.path().join("c.sock")).to_args());
    let out = gvfs_testbed::process::run(&mut cmd, Duration::from_secs(60))?;
    let tls = i32::from(gvfs_proxy::exit::ExitCode::Tls.code());
    Ok((out.status.code() == Some(tls), out.stderr_text()))
}

#[test]
fn a_client_proxy_refused_by_tls_exits_at_once_with_the_reason() -> Result<()> {
    let pki = Pki::new(&["image-server"])?;
    let site = tempfile::tempdir()?;
    let origin = format!("dir:{}", site.path().display());
    let (_server, tls) = image_server(&pki, ProxyArgs::new(origin))?;
    // Another site's CA, and one that happens to have our CA's name.
    let rogue = Pki::named("another site CA")?;
    rogue.issue("intruder")?;
    let namesake = Pki::new(&[])?;
    namesake.issue("intruder")?;
    for (other, reason) in [
        (&rogue, "the server rejected our certificate: unknown CA"),
        (
            &namesake,
            "the server rejected our certificate: its signature",
        ),
    ] {
        // The intruder's CA file holds both CAs: its own certificate passes
        // its own check at start and it trusts the server, but the server
        // does not trust the intruder's CA.
        let both = other.ca_dir().join("both.pem");
        std::fs::write(
            &both,
            [
                std::fs::read(pki.files("image-server").ca)?,
                std::fs::read(other.files("intruder").ca)?,
            ]
            .concat(),
        )?;
        let intruder = gvfs_tunnel::TlsFiles {
            ca: both,
            ..other.files("intruder")
        };
        let (refused, err) = start_up_failure(with_files(intruder, ProxyArgs::new(gvfs_url(tls))))?;
        ensure!(
            refused,
            "not exit code 5 with a certificate the server rejects: {err}"
        );
        ensure!(err.contains(reason), "not the reason ({reason}): {err}");
    }
    // The other way round: the client does not trust the server's CA.
    let (refused, err) = start_up_failure(rogue.args("intruder", ProxyArgs::new(gvfs_url(tls))))?;
    ensure!(
        refused,
        "not exit code 5 against a server it cannot trust: {err}"
    );
    ensure!(
        err.contains("we rejected the server's certificate: not signed by our CA"),
        "not the reason: {err}"
    );
    Ok(())
}

fn owner(path: &Path) -> Result<(u32, u32)> {
    let m = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    Ok((m.uid(), m.gid()))
}

#[test]
fn peers_are_mapped_to_their_configured_identities_at_the_origin() -> Result<()> {
    let pki = Pki::new(&[])?;
    for n in ["image-server", "node1", "node2", "node3", "node4"] {
        pki.issue(n)?;
    }
    let site = tempfile::tempdir()?;
    std::fs::set_permissions(
        site.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )?;
    let origin = format!("dir:{}", site.path().display());
    let (_server, tls) = image_server(
        &pki,
        ProxyArgs::new(origin)
            .map_peer("node1", "fixed:1234:5678")
            .map_peer("node2", "range:0-100")
            .map_peer("node3", "range:500-600"),
    )?;
    let local = tempfile::tempdir()?;
    let src = local.path().join("small.bin");
    write_random_file(&src, 1, 5000)?;
    let src_s = src.display().to_string();
    // libnfs calls as the test's own uid/gid (root: 0/0).
    let expect = [
        ("node1", (1234, 5678)),   // fixed
        ("node2", (0, 0)),         // 0 is inside 0-100: passes through
        ("node3", (65534, 65534)), // 0 is outside 500-600: nobody
        ("node4", (65534, 65534)), // no rule: unknown peers are squashed
    ];
    for (node, want) in expect {
        let c = Proxy::spawn(pki.args(node, ProxyArgs::new(gvfs_url(tls))))?;
        let name = format!("{node}.bin");
        nfs_cp(&src_s, &c.url(&name)).with_context(|| format!("copy via {node}"))?;
        let got = owner(&site.path().join(&name))?;
        ensure!(got == want, "{node}: owner {got:?}, want {want:?}");
    }
    Ok(())
}

/// A rustls client config trusting `pki`'s CA, presenting `name`'s
/// certificate (or none).
fn client_config(pki: &Pki, name: Option<&str>) -> Result<Arc<rustls::ClientConfig>> {
    match name {
        Some(n) => Ok(gvfs_tunnel::TlsIdentity::load(&pki.files(n))?.client_config()),
        None => {
            use rustls::pki_types::CertificateDer;
            use rustls::pki_types::pem::PemObject;
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(pki.ca_dir().join("ca.pem"))? {
                roots.add(c?)?;
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let cfg = rustls::ClientConfig::builder_with_provider(provider)
                .with_protocol_versions(&[&rustls::version::TLS13])?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(Arc::new(cfg))
        }
    }
}

/// A rustls client config from PEM files, with none of the checks
/// `TlsIdentity::load` makes (to present certificates it would refuse).
fn raw_client_config(f: &gvfs_tunnel::TlsFiles) -> Result<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&f.ca)? {
        roots.add(c?)?;
    }
    let chain = CertificateDer::pem_file_iter(&f.cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&f.key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    Ok(Arc::new(cfg))
}

/// One RPC NULL call to NFS over `s`; errors if the reply does not come.
async fn null_call<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Result<()> {
    let rec = rpc::seal(rpc::call_record(7, 100_003, 3, 0, &Credentials::unix(0, 0)));
    s.write_all(&rec).await?;
    let mut r = RecordStream::new(s, RecordLimits::for_payload(1 << 16));
    let reply = tokio::time::timeout(Duration::from_secs(5), r.next())
        .await
        .context("no reply in 5 s")??
        .context("closed without a reply")?;
    rpc::parse_reply(&reply).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// A TLS handshake to `addr`, then a NULL call inside TLS.
async fn tls_null_call(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> Result<()> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("image-server")?.to_owned();
    let mut s = tokio::time::timeout(
        Duration::from_secs(5),
        tokio_rustls::TlsConnector::from(cfg).connect(name, tcp),
    )
    .await
    .context("handshake timed out")??;
    null_call(&mut s).await
}

/// An RFC 9289 probe: a NULL call with AUTH_TLS. Returns the verifier body.
async fn probe(s: &mut tokio::net::TcpStream) -> Result<Vec<u8>> {
    let mut rec = vec![0u8; 4];
    for v in [0x51u32, 0, 2, 100_003, 3, 0, rpc::flavor::TLS, 0, 0, 0] {
        xdr::put_u32(&mut rec, v);
    }
    s.write_all(&rpc::seal(rec)).await?;
    let mut r = RecordStream::new(&mut *s, RecordLimits::for_payload(1 << 16));
    let reply = tokio::time::timeout(Duration::from_secs(5), r.next())
        .await
        .context("no reply to the probe")??
        .context("closed")?;
    ensure!(r.buffered().is_empty(), "bytes after the probe's reply");
    let mut x = XdrReader::new(&reply);
    let head = [x.u32()?, x.u32()?, x.u32()?, x.u32()?];
    ensure!(head == [0x51, 1, 0, 0], "probe reply header {head:?}");
    let verf = x.opaque(400)?.to_vec();
    ensure!(x.u32()? == 0, "probe not accepted");
    Ok(verf)
}

#[test]
fn rfc_9289_starttls_probe_switches_the_connection_to_tls() -> Result<()> {
    let pki = Pki::new(&["image-server", "node1"])?;
    let site = tempfile::tempdir()?;
    std::fs::write(site.path().join("f"), b"inside tls")?;
    let p = Proxy::spawn(pki.args(
        "image-server",
        ProxyArgs::new(format!("dir:{}", site.path().display())),
    ))?;
    let rt = tokio::runtime::Runtime::new()?;
    for (who, cfg) in [
        (
            "with a client certificate (mtls)",
            client_config(&pki, Some("node1"))?,
        ),
        ("without one (tls)", client_config(&pki, None)?),
    ] {
        rt.block_on(async {
            let mut tcp = tokio::net::TcpStream::connect(p.addr()).await?;
            let verf = probe(&mut tcp).await?;
            ensure!(verf == rpc::STARTTLS, "verifier {verf:?}");
            let name = rustls::pki_types::ServerName::try_from("image-server")?.to_owned();
            let mut tls = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, tcp)
                .await
                .context("handshake after STARTTLS")?;
            null_call(&mut tls).await?;
            // MOUNT and an NFS GETATTR of the root, inside TLS.
            let mut args = Vec::new();
            xdr::put_opaque(&mut args, b"/export");
            let mut rec = rpc::call_record(8, 100_005, 3, 1, &Credentials::unix(0, 0));
            rec.extend_from_slice(&args);
            tls.write_all(&rpc::seal(rec)).await?;
            let mut r = RecordStream::new(&mut tls, RecordLimits::for_payload(1 << 16));
            let reply = r.next().await?.context("no MNT reply")?;
            let res = rpc::parse_reply(&reply).map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut x = XdrReader::new(res);
            ensure!(x.u32()? == 0, "MNT refused");
            let fh = x.opaque(64)?.to_vec();
            let mut rec = rpc::call_record(9, 100_003, 3, 1, &Credentials::unix(0, 0));
            xdr::put_opaque(&mut rec, &fh);
            drop(r);
            tls.write_all(&rpc::seal(rec)).await?;
            let mut r = RecordStream::new(&mut tls, RecordLimits::for_payload(1 << 16));
            let reply = r.next().await?.context("no GETATTR reply")?;
            let res = rpc::parse_reply(&reply).map_err(|e| anyhow::anyhow!("{e}"))?;
            ensure!(XdrReader::new(res).u32()? == 0, "GETATTR failed");
            Ok::<_, anyhow::Error>(())
        })
        .with_context(|| format!("STARTTLS {who}"))?;
    }
    ensure!(
        p.stats()?.status.connections.counts.starttls == 2,
        "status: {:?}",
        p.status()?
    );
    // AUTH_TLS on anything but NULL is refused with AUTH_BADCRED.
    let mut rec = vec![0u8; 4];
    for v in [0x52u32, 0, 2, 100_003, 3, 1, rpc::flavor::TLS, 0, 0, 0] {
        xdr::put_u32(&mut rec, v);
    }
    xdr::put_opaque(&mut rec, &[0; 8]);
    let reply = rt.block_on(async {
        let mut s = tokio::net::TcpStream::connect(p.addr()).await?;
        s.write_all(&rpc::seal(rec)).await?;
        let mut r = RecordStream::new(&mut s, RecordLimits::for_payload(1 << 16));
        r.next().await?.context("no reply")
    })?;
    ensure!(
        rpc::parse_reply(&reply)
            == Err(rpc::ReplyError::Denied(rpc::ReplyStatus::AuthError(
                rpc::auth_stat::BADCRED
            ))),
        "AUTH_TLS GETATTR answered {:?}",
        rpc::parse_reply(&reply)
    );
    // Plain clients still work on the same port.
    ensure!(nfs_cat(&p.url("f"))? == b"inside tls");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20_second_outage_delays_a_large_read_and_write_without_errors() -> Result<()> {
    let site = Site::builder(Origin::Ganesha)
        .pki()
        .wan(gvfs_wanlink::LinkConfig::from_rtt(
            Duration::from_millis(2),
            None,
        ))
        .node(Tier::new())
        .start()?;
    let (link, client) = (site.wan()?, site.node(0)?);
    let local = tempfile::tempdir()?;
    let src = local.path().join("big.bin");
    write_random_file(&src, 8, 160 * MIB)?;
    let outage = Duration::from_secs(20);
    for direction in ["write", "read"] {
        let (from, to) = match direction {
            "write" => (src.display().to_string(), client.url("big.bin")),
            _ => (
                client.url("big.bin"),
                local.path().join("back.bin").display().to_string(),
            ),
        };
        let copy = tokio::task::spawn_blocking(move || nfs_cp(&from, &to));
        tokio::time::sleep(Duration::from_millis(300)).await;
        ensure!(!copy.is_finished(), "{direction} finished before the cut");
        link.cut();
        tokio::time::sleep(outage).await;
        link.restore();
        copy.await?
            .with_context(|| format!("the {direction} failed across the outage"))?;
    }
    compare_files(&src, &site.origin_dir().join("big.bin")).context("written across the outage")?;
    compare_files(&src, &local.path().join("back.bin")).context("read across the outage")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_block_cache_keeps_serving_reads_and_writes_during_an_outage() -> Result<()> {
    use gvfs_nfs::NfsRequest;
    use gvfs_nfs::nfs3_types::nfs3::*;
    use gvfs_nfs::nfs3_types::xdr_codec::Opaque;

    let site = Site::builder(Origin::Dir)
        .pki()
        .wan(gvfs_wanlink::LinkConfig::from_rtt(
            Duration::from_millis(2),
            None,
        ))
        .node(Tier::new().cache_dir())
        .start_with(|dir| write_random_file(&dir.join("img.bin"), 3, 4 * MIB))?;
    let image = site.origin_dir().join("img.bin");
    let want = std::fs::read(&image)?;
    let (link, client) = (site.wan()?, site.node(0)?);
    let c = gvfs_testbed::nfsclient::NfsClient::of_proxy(client, Duration::from_secs(10)).await?;
    let fh = c.resolve("img.bin").await?.context("img.bin")?;
    let read = |offset: u64| {
        let (c, fh) = (c.clone(), fh.clone());
        async move {
            let r = c
                .call(NfsRequest::Read(READ3args {
                    file: fh,
                    offset,
                    count: MIB as u32,
                }))
                .await?;
            match r {
                gvfs_nfs::NfsReply::Read(Nfs3Result::Ok(ok)) => Ok(ok.data.to_vec()),
                other => bail!("READ at {offset}: {:?}", other.status()),
            }
        }
    };
    // Warm the cache, then cut the link.
    for i in 0..4 {
        ensure!(read(i * MIB).await? == want[(i * MIB) as usize..((i + 1) * MIB) as usize]);
    }
    link.cut();
    let during = async {
        for i in 0..4 {
            let got = read(i * MIB).await?;
            ensure!(got == want[(i * MIB) as usize..((i + 1) * MIB) as usize]);
        }
        let w = c
            .call(NfsRequest::Write(WRITE3args {
                file: fh.clone(),
                offset: 100,
                count: 5,
                stable: stable_how::UNSTABLE,
                data: Opaque::owned(b"hello".to_vec()),
            }))
            .await?;
        ensure!(w.status() == nfsstat3::NFS3_OK, "WRITE during the outage");
        let commit = c
            .call(NfsRequest::Commit(COMMIT3args {
                file: fh.clone(),
                offset: 0,
                count: 0,
            }))
            .await?;
        ensure!(
            commit.status() == nfsstat3::NFS3_OK,
            "COMMIT during the outage"
        );
        let got = read(0).await?;
        ensure!(&got[100..105] == b"hello", "the write is not read back");
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(10), during)
        .await
        .context("the cache did not answer during the outage")??;
    link.restore();
    client.write_back()?;
    let mut expect = want.clone();
    expect[100..105].copy_from_slice(b"hello");
    ensure!(
        std::fs::read(&image)? == expect,
        "written back after the outage"
    );
    Ok(())
}

#[test]
fn compress_and_copy_runs_inside_the_tunnel() -> Result<()> {
    let site = Site::builder(Origin::Ganesha)
        .pki()
        .node(Tier::new().cache("64M"))
        .start_with(|dir| {
            let image = dir.join("mem.raw");
            gvfs_testbed::data::write_memory_image(&image, 12 * MIB + 4096, 9)?;
            gvfs_testbed::proxy::gvfsctl_local(&[
                "meta",
                "gen",
                &image.display().to_string(),
                "--compress",
            ])
            .map(drop)
        })?;
    let image = site.origin_dir().join("mem.raw");
    let (server, client) = (site.image_server(), site.node(0)?);
    let local = tempfile::tempdir()?;
    let back = local.path().join("mem.raw");
    nfs_cp(&client.url("mem.raw"), &back.display().to_string())?;
    compare_files(&image, &back).context("compress-and-copy through the tunnel")?;
    let (c, s) = (client.stats()?, server.stats()?);
    let chunks = c.file_cache.counts.chunks_fetched;
    ensure!(
        c.meta.copy_reads > 0 && chunks + c.file_cache.counts.zero_chunks == 13,
        "the client did not fetch the image whole: {c}"
    );
    // The client reaches the image server only over TLS.
    ensure!(
        s.ext.fetch_calls == chunks && server.stats()?.status.connections.counts.tls_accepted >= 1,
        "image server: {s}"
    );
    Ok(())
}

/// Two nodes, each with a certificate of its own, copy large files through
/// one LAN proxy at once, with a memory budget small enough that each holds
/// it back: the LAN bills each certificate as a tenant of its own, and both
/// copies finish byte for byte.
#[test]
fn two_certificates_through_one_lan_proxy_both_make_progress() -> Result<()> {
    let site = Site::builder(Origin::Dir)
        .pki()
        .lan(Tier::new().args(|a| a.buffer_memory("8M")))
        .nodes(2, Tier::new())
        .start_with(|dir| {
            write_random_file(&dir.join("a.bin"), 11, 48 * MIB)?;
            write_random_file(&dir.join("b.bin"), 12, 48 * MIB)
        })?;
    let local = tempfile::tempdir()?;
    let copies: Vec<_> = ["a.bin", "b.bin"]
        .iter()
        .enumerate()
        .map(|(i, name)| -> Result<_> {
            let url = site.node(i)?.url(name);
            let to = local.path().join(name);
            let to_s = to.display().to_string();
            Ok((std::thread::spawn(move || nfs_cp(&url, &to_s)), to))
        })
        .collect::<Result<_>>()?;
    for ((copy, to), name) in copies.into_iter().zip(["a.bin", "b.bin"]) {
        copy.join()
            .map_err(|_| anyhow::anyhow!("a copy panicked"))??;
        compare_files(&site.origin_dir().join(name), &to).with_context(|| name.to_owned())?;
    }
    let lan = site.lan()?.status()?;
    ensure!(
        lan.connections.counts.tls_accepted >= 2,
        "the nodes did not come as TLS peers: {lan:?}"
    );
    ensure!(
        lan.buffers.peak_bytes > 0 && lan.buffers.peak_bytes <= 8 * MIB + 2 * 2 * MIB,
        "the LAN held more than its budget and a call per connection: {lan:?}"
    );
    Ok(())
}
