//! TLS 1.3 handshakes between issued identities over real sockets on
//! 127.0.0.1, and the handshakes that must fail.

mod common;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use common::{Site, both_cas};
use gvfs_nfs::net::client::Connector;
use gvfs_tunnel::{AcceptError, TlsConnector, TlsFiles, TlsIdentity, accept};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const HANDSHAKE: Duration = Duration::from_secs(30);

/// What the server saw: the peer name, or why the handshake failed.
type Served = Result<Option<String>, AcceptError>;

/// Accepts one connection with `config`; on success echoes one 5-byte
/// message back and returns the peer name.
async fn serve_one(config: Arc<rustls::ServerConfig>) -> (u16, JoinHandle<Served>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let port = listener.local_addr().expect("test setup").port();
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("server: accept TCP");
        let (mut tls, peer) = accept(tcp, config, HANDSHAKE).await?;
        let mut buf = [0u8; 5];
        tls.read_exact(&mut buf)
            .await
            .expect("server: read the message");
        tls.write_all(&buf).await.expect("server: echo");
        tls.flush().await.expect("server: flush");
        // Wait for the client to close, so it can read the echo.
        let _ = tls.read(&mut buf).await;
        Ok(peer)
    });
    (port, task)
}

fn connector(port: u16, server_name: Option<&str>, identity: &TlsIdentity) -> TlsConnector {
    TlsConnector::new(
        "127.0.0.1".into(),
        port,
        server_name.map(str::to_owned),
        identity,
        Duration::from_secs(10),
        HANDSHAKE,
    )
    .expect("test setup")
}

/// Sends a message and reads the echo; the error if there is none.
async fn echo<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
) -> io::Result<()> {
    s.write_all(b"hello").await?;
    s.flush().await?;
    let mut buf = [0u8; 5];
    s.read_exact(&mut buf).await?;
    assert_eq!(&buf, b"hello");
    Ok(())
}

/// A client that got through its side of the handshake must still fail at
/// the first read when the server refused its certificate (TLS 1.3 client
/// authentication completes after the client's Finished).
async fn assert_client_refused<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    opened: io::Result<S>,
) -> String {
    match opened {
        Err(e) => e.to_string(),
        Ok(mut s) => match echo(&mut s).await {
            Err(e) => e.to_string(),
            Ok(()) => panic!("the client was served"),
        },
    }
}

fn handshake_error(served: Served) -> String {
    match served {
        Err(AcceptError::Handshake(e)) => e.to_string(),
        Err(other) => panic!("expected a handshake error, got {other}"),
        Ok(peer) => panic!("the server accepted {peer:?}"),
    }
}

/// A bare rustls client trusting `ca`, presenting `cert` if given.
fn raw_client(ca: &TlsFiles, cert: Option<&TlsFiles>) -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&ca.ca).expect("test setup") {
        roots.add(c.expect("test setup")).expect("test setup");
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("test setup")
        .with_root_certificates(roots);
    let config = match cert {
        Some(files) => {
            let chain = CertificateDer::pem_file_iter(&files.cert)
                .expect("test setup")
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_file(&files.key).expect("test setup");
            builder
                .with_client_auth_cert(chain, key)
                .expect("test setup")
        }
        None => builder.with_no_client_auth(),
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn raw_connect(
    connector: &tokio_rustls::TlsConnector,
    port: u16,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let name = ServerName::try_from("127.0.0.1").expect("test setup");
    connector.connect(name, tcp).await
}

#[tokio::test]
async fn mutual_handshake_both_sides_see_names_and_bytes_round_trip() {
    let site = Site::new("site");
    let server = site.identity("image-server");
    let client = site.identity("lan-proxy");
    for config in [server.server_config(), server.starttls_config()] {
        assert_eq!(config.send_tls13_tickets, 0, "no session tickets");
        assert!(config.alpn_protocols.is_empty());
    }

    let (port, served) = serve_one(server.server_config()).await;
    let (mut tls, server_name) = connector(port, None, &client).open().await.unwrap();
    assert_eq!(server_name, "image-server");
    let (_, conn) = tls.get_ref();
    assert_eq!(
        conn.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    assert_eq!(conn.alpn_protocol(), None);
    echo(&mut tls).await.unwrap();
    drop(tls);
    assert_eq!(served.await.unwrap().unwrap().as_deref(), Some("lan-proxy"));

    // The same through the Connector trait the RPC client uses, naming the
    // server explicitly.
    let (port, served) = serve_one(server.server_config()).await;
    let conn = connector(port, Some("image-server"), &client);
    assert_eq!(
        conn.describe(),
        format!("127.0.0.1:{port} (TLS, server name image-server)")
    );
    let mut stream = conn.connect().await.unwrap();
    echo(&mut stream).await.unwrap();
    drop(stream);
    assert_eq!(served.await.unwrap().unwrap().as_deref(), Some("lan-proxy"));
}

#[tokio::test]
async fn server_certificate_from_an_unknown_ca_is_refused() {
    let site = Site::new("site");
    let elsewhere = Site::new("elsewhere");
    let server = elsewhere.identity("impostor");
    let client = site.identity("lan-proxy");

    let (port, served) = serve_one(server.server_config()).await;
    let c = connector(port, None, &client);
    let err = c.open().await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("TLS handshake with 127.0.0.1:{port} failed"))
            && msg.contains("we rejected the server's certificate: not signed by our CA"),
        "{msg}"
    );
    // A refusal, which the RPC client does not retry.
    assert_eq!(c.refusal(&err).as_deref(), Some(msg.as_str()));
    handshake_error(served.await.unwrap());
}

#[tokio::test]
async fn client_certificate_from_an_unknown_ca_is_refused() {
    let site = Site::new("site");
    let elsewhere = Site::new("elsewhere");
    let server = site.identity("image-server");
    // The client trusts the server's CA, but its own certificate comes from
    // a CA the server does not trust.
    let mut files = elsewhere.issue("intruder");
    files.ca = both_cas(elsewhere.dir.path(), &site, &elsewhere);
    let client = TlsIdentity::load(&files).unwrap();

    let (port, served) = serve_one(server.server_config()).await;
    let c = connector(port, None, &client);
    let (mut s, _) = c.open().await.expect("our side of the handshake");
    // The server's alert comes on the first read, and is a refusal.
    let e = s
        .read(&mut [0u8; 1])
        .await
        .expect_err("the client was served");
    assert_eq!(
        c.refusal(&e).as_deref(),
        Some("the server rejected our certificate: unknown CA")
    );
    let msg = handshake_error(served.await.unwrap());
    assert!(msg.contains("UnknownIssuer"), "{msg}");

    // STARTTLS makes the certificate optional, not unverified.
    let (port, served) = serve_one(server.starttls_config()).await;
    let opened = connector(port, None, &client).open().await.map(|(s, _)| s);
    assert_client_refused(opened).await;
    handshake_error(served.await.unwrap());
}

#[tokio::test]
async fn expired_client_certificate_is_refused() {
    let site = Site::new("site");
    let server = site.identity("image-server");
    let expired = site.issue_expired("old-proxy");
    assert!(TlsIdentity::load(&expired).is_err());
    let client = raw_client(&expired, Some(&expired));

    let (port, served) = serve_one(server.server_config()).await;
    assert_client_refused(raw_connect(&client, port).await).await;
    let msg = handshake_error(served.await.unwrap());
    assert!(msg.contains("certificate expired"), "{msg}");
}

#[tokio::test]
async fn a_client_without_certificate_is_refused_by_server_config() {
    let site = Site::new("site");
    let server = site.identity("image-server");
    let ca_only = site.issue("unused");
    let client = raw_client(&ca_only, None);

    let (port, served) = serve_one(server.server_config()).await;
    assert_client_refused(raw_connect(&client, port).await).await;
    let msg = handshake_error(served.await.unwrap());
    assert!(msg.contains("no certificates"), "{msg}");
}

#[tokio::test]
async fn starttls_config_accepts_a_client_without_certificate() {
    let site = Site::new("site");
    let server = site.identity("image-server");
    let ca_only = site.issue("unused");

    let (port, served) = serve_one(server.starttls_config()).await;
    let mut tls = raw_connect(&raw_client(&ca_only, None), port)
        .await
        .unwrap();
    echo(&mut tls).await.unwrap();
    drop(tls);
    assert_eq!(served.await.unwrap().unwrap(), None);

    // A client that does present a certificate is named.
    let client = site.identity("lan-proxy");
    let (port, served) = serve_one(server.starttls_config()).await;
    let (mut tls, _) = connector(port, None, &client).open().await.unwrap();
    echo(&mut tls).await.unwrap();
    drop(tls);
    assert_eq!(served.await.unwrap().unwrap().as_deref(), Some("lan-proxy"));
}

#[tokio::test]
async fn wrong_server_name_is_refused() {
    let site = Site::new("site");
    let server = site.identity("image-server");
    let client = site.identity("lan-proxy");

    let (port, served) = serve_one(server.server_config()).await;
    let err = connector(port, Some("elsewhere.example"), &client)
        .open()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("not valid for name \"elsewhere.example\""),
        "{err}"
    );
    handshake_error(served.await.unwrap());
}

#[tokio::test]
async fn plain_rpc_bytes_fail_the_handshake_without_waiting() {
    let site = Site::new("site");
    let server = site.identity("image-server");
    let (port, served) = serve_one(server.server_config()).await;

    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // An RPC record mark and the start of a NULL call (RFC 5531).
    let mut call = vec![0x80, 0, 0, 40];
    call.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0x86, 0xa3]);
    call.extend_from_slice(&[0u8; 24]);
    tcp.write_all(&call).await.unwrap();
    // The server fails on the bytes it got, long before its 30 s timeout,
    // while this client keeps the connection open.
    let msg = handshake_error(served.await.unwrap());
    assert!(!msg.is_empty());
    drop(tcp);
}

#[tokio::test(start_paused = true)]
async fn a_silent_client_times_out() {
    let site = Site::new("site");
    let server = site.identity("image-server");
    let (port, served) = serve_one(server.server_config()).await;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    match served.await.unwrap() {
        Err(AcceptError::Timeout(t)) => assert_eq!(t, HANDSHAKE),
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop(tcp);
}

#[tokio::test]
async fn connect_errors_name_the_address() {
    let site = Site::new("site");
    let client = site.identity("lan-proxy");
    // A port that nothing listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let err = connector(port, None, &client)
        .connect()
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .starts_with(&format!("connecting to 127.0.0.1:{port} failed")),
        "{err}"
    );
    assert!(
        TlsConnector::new(
            "127.0.0.1".into(),
            1,
            Some("not a name".into()),
            &client,
            HANDSHAKE,
            HANDSHAKE
        )
        .is_err()
    );
    let v6 = TlsConnector::new("[::1]".into(), 2049, None, &client, HANDSHAKE, HANDSHAKE).unwrap();
    assert_eq!(v6.describe(), "[::1]:2049 (TLS)");
}
