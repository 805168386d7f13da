//! rustls configurations from the PEM files, the server handshake, and the
//! `gvfs://` connector.
//!
//! Everything here is TLS 1.3 only, with the ring provider, no session
//! resumption (every connection verifies the peer's certificate afresh, so
//! an expired certificate stops working at the next reconnect) and no ALPN.
//! Between proxies a client certificate is required ([`TlsIdentity::server_config`]);
//! after an RFC 9289 STARTTLS on a plain NFS port it is optional
//! ([`TlsIdentity::starttls_config`]), because Linux `xprtsec=tls` sends none.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gvfs_nfs::BoxFuture;
use gvfs_nfs::net::client::{BoxStream, Connector, Refusal, refusal_of};
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use time::OffsetDateTime;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use x509_parser::extensions::GeneralName;

use crate::error::TunnelError;
use crate::read;

/// The three PEM files of a proxy's TLS identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Our node certificate (optionally followed by intermediates).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The site CA certificate(s) peers must chain to.
    pub ca: PathBuf,
}

/// A proxy's TLS identity: its certificate, key and trusted CA, checked and
/// turned into rustls configurations once at start. Cheap to clone.
#[derive(Clone)]
pub struct TlsIdentity {
    inner: Arc<Identity>,
}

struct Identity {
    name: String,
    files: TlsFiles,
    server: Arc<ServerConfig>,
    starttls: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

impl fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("name", &self.inner.name)
            .field("files", &self.inner.files)
            .finish_non_exhaustive()
    }
}

/// The crypto provider for every configuration: ring (aws-lc-rs needs cmake).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsIdentity {
    /// Loads and checks the PEM files. Errors name the file and what is wrong:
    /// missing, unreadable, not PEM, key does not match the certificate,
    /// certificate not signed by the CA, expired or not yet valid.
    pub fn load(files: &TlsFiles) -> Result<TlsIdentity, TunnelError> {
        let provider = provider();
        let ca_certs = read::certificates(&files.ca)?;
        let mut roots = RootCertStore::empty();
        for ca in ca_certs {
            roots.add(ca).map_err(|e| TunnelError::BadCertificate {
                path: files.ca.clone(),
                detail: e.to_string(),
            })?;
        }
        let roots = Arc::new(roots);
        let chain = read::certificates(&files.cert)?;
        let key = read::private_key(&files.key)?;
        check_key_matches(files, &chain, &key, &provider)?;
        check_validity(files, &chain[0])?;
        check_signed_by_ca(files, &chain, &roots, &provider)?;
        let name = peer_name(&chain[0]).ok_or_else(|| TunnelError::Nameless {
            path: files.cert.clone(),
        })?;

        let server = server_config(files, &provider, &roots, &chain, &key, false)?;
        let starttls = server_config(files, &provider, &roots, &chain, &key, true)?;
        let client = client_config(files, &provider, &roots, chain, key)?;
        tracing::debug!(name, cert = %files.cert.display(), "loaded the TLS identity");
        Ok(TlsIdentity {
            inner: Arc::new(Identity {
                name,
                files: files.clone(),
                server: Arc::new(server),
                starttls: Arc::new(starttls),
                client: Arc::new(client),
            }),
        })
    }

    /// The name in our own certificate (see [`peer_name`]).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The files this identity was loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.inner.files
    }

    /// Server side of `--listen-tls`: TLS 1.3 only, a client certificate is
    /// required and verified against the CA, no session tickets, no ALPN.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.inner.server.clone()
    }

    /// Server side after an RFC 9289 STARTTLS on a plain port: like
    /// [`server_config`](Self::server_config) but a client certificate is
    /// optional (and verified if presented): Linux `xprtsec=tls` sends none,
    /// `xprtsec=mtls` sends one.
    pub fn starttls_config(&self) -> Arc<ServerConfig> {
        self.inner.starttls.clone()
    }

    /// Client side: TLS 1.3, presents our certificate, verifies the server
    /// against the CA and the server name.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.inner.client.clone()
    }
}

fn check_key_matches(
    files: &TlsFiles,
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
    provider: &CryptoProvider,
) -> Result<(), TunnelError> {
    use rustls::{Error, InconsistentKeys};
    match rustls::sign::CertifiedKey::from_der(chain.to_vec(), key.clone_key(), provider) {
        Ok(_) => Ok(()),
        Err(Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
            Err(TunnelError::KeyMismatch {
                key: files.key.clone(),
                cert: files.cert.clone(),
            })
        }
        Err(e) => Err(TunnelError::BadKey {
            path: files.key.clone(),
            detail: e.to_string(),
        }),
    }
}

/// Checks the validity period ourselves, for a message with the date in it.
fn check_validity(files: &TlsFiles, cert: &CertificateDer<'_>) -> Result<(), TunnelError> {
    let parsed = read::parse_x509(&files.cert, cert)?;
    let validity = parsed.validity();
    let now = OffsetDateTime::now_utc();
    if validity.not_after.to_datetime() < now {
        return Err(TunnelError::Expired {
            path: files.cert.clone(),
            not_after: validity.not_after.to_string(),
        });
    }
    if validity.not_before.to_datetime() > now {
        return Err(TunnelError::NotYetValid {
            path: files.cert.clone(),
            not_before: validity.not_before.to_string(),
        });
    }
    Ok(())
}

/// Checks that our certificate chains to the CA, as a peer will. A proxy
/// needs its certificate for both roles; one fit for serving only is
/// accepted with a warning (such a proxy cannot connect to a `gvfs://`
/// upstream).
fn check_signed_by_ca(
    files: &TlsFiles,
    chain: &[CertificateDer<'static>],
    roots: &RootCertStore,
    provider: &CryptoProvider,
) -> Result<(), TunnelError> {
    let end_entity =
        webpki::EndEntityCert::try_from(&chain[0]).map_err(|e| TunnelError::BadCertificate {
            path: files.cert.clone(),
            detail: e.to_string(),
        })?;
    let verify = |usage| {
        end_entity
            .verify_for_usage(
                provider.signature_verification_algorithms.all,
                &roots.roots,
                &chain[1..],
                UnixTime::now(),
                usage,
                None,
                None,
            )
            .map(|_| ())
    };
    let as_client = verify(webpki::KeyUsage::client_auth());
    let Err(client_error) = as_client else {
        return Ok(());
    };
    if verify(webpki::KeyUsage::server_auth()).is_ok() {
        tracing::warn!(
            cert = %files.cert.display(),
            "the certificate is not valid for TLS client authentication: this proxy cannot use it to connect to another proxy"
        );
        return Ok(());
    }
    Err(match client_error {
        webpki::Error::UnknownIssuer => TunnelError::NotSignedByCa {
            cert: files.cert.clone(),
            ca: files.ca.clone(),
        },
        other => TunnelError::CertificateRejected {
            path: files.cert.clone(),
            detail: other.to_string(),
        },
    })
}

fn server_config(
    files: &TlsFiles,
    provider: &Arc<CryptoProvider>,
    roots: &Arc<RootCertStore>,
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
    client_cert_optional: bool,
) -> Result<ServerConfig, TunnelError> {
    let config_error = |path: &PathBuf, e: &dyn fmt::Display| TunnelError::Config {
        path: path.clone(),
        detail: e.to_string(),
    };
    let mut verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
    if client_cert_optional {
        verifier = verifier.allow_unauthenticated();
    }
    let verifier = verifier.build().map_err(|e| config_error(&files.ca, &e))?;
    let mut config = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| config_error(&files.cert, &e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.to_vec(), key.clone_key())
        .map_err(|e| config_error(&files.cert, &e))?;
    // No resumption: no stateful session cache and no tickets, so every
    // connection presents and verifies a certificate.
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(config)
}

fn client_config(
    files: &TlsFiles,
    provider: &Arc<CryptoProvider>,
    roots: &Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<ClientConfig, TunnelError> {
    let config_error = |path: &PathBuf, e: &dyn fmt::Display| TunnelError::Config {
        path: path.clone(),
        detail: e.to_string(),
    };
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    .map_err(|e| config_error(&files.ca, &e))?;
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| config_error(&files.cert, &e))?
        .with_webpki_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|e| config_error(&files.cert, &e))?;
    config.resumption = Resumption::disabled();
    Ok(config)
}

/// The identity of a verified certificate: the subject CN if present, else
/// the first DNS SAN, else the first IP SAN as text. `None` if the
/// certificate does not parse or has none of these.
pub fn peer_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .find_map(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty());
    if let Some(cn) = cn {
        return Some(cn.to_owned());
    }
    let sans = cert.subject_alternative_name().ok().flatten()?;
    let names = &sans.value.general_names;
    let dns = names.iter().find_map(|n| match n {
        GeneralName::DNSName(d) if !d.is_empty() => Some((*d).to_owned()),
        _ => None,
    });
    dns.or_else(|| {
        names.iter().find_map(|n| match n {
            GeneralName::IPAddress(bytes) => ip_from_bytes(bytes).map(|ip| ip.to_string()),
            _ => None,
        })
    })
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        Some(IpAddr::from(v4))
    } else if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
        Some(IpAddr::from(v6))
    } else {
        None
    }
}

/// Why a server handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The peer did not complete the handshake in time (or sent nothing).
    #[error("TLS handshake timed out after {0:?}")]
    Timeout(Duration),
    /// The handshake failed: not TLS, a rejected certificate, a dropped
    /// connection.
    #[error("TLS handshake failed: {0}")]
    Handshake(io::Error),
}

/// Runs the server handshake on `tcp` within `timeout`; returns the stream
/// and the verified peer name (`None` if the client sent no certificate,
/// possible only with [`TlsIdentity::starttls_config`]).
///
/// Works on any stream, so the STARTTLS path can upgrade a connection it has
/// already read from. A verified certificate that carries no name at all is
/// refused rather than treated like no certificate.
pub async fn accept<S>(
    tcp: S,
    config: Arc<ServerConfig>,
    timeout: Duration,
) -> Result<(tokio_rustls::server::TlsStream<S>, Option<String>), AcceptError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let stream = tokio::time::timeout(timeout, acceptor.accept(tcp))
        .await
        .map_err(|_| AcceptError::Timeout(timeout))?
        .map_err(AcceptError::Handshake)?;
    let peer = match stream.get_ref().1.peer_certificates() {
        Some([end_entity, ..]) => Some(peer_name(end_entity).ok_or_else(|| {
            AcceptError::Handshake(io::Error::new(
                io::ErrorKind::InvalidData,
                "the client certificate has no name (no subject CN, DNS or IP SAN)",
            ))
        })?),
        _ => None,
    };
    Ok((stream, peer))
}

/// Opens TLS connections to HOST:PORT, verifying the server's certificate
/// for `server_name` (HOST by default) and presenting ours. Implements
/// [`Connector`] for a `gvfs://` upstream.
///
/// With TLS 1.3 the client's handshake ends before the server has checked
/// the client's certificate, so a server that refuses our certificate shows
/// up as an error on the first read, not from `connect`.
#[derive(Clone)]
pub struct TlsConnector {
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    connector: tokio_rustls::TlsConnector,
    connect_timeout: Duration,
    handshake_timeout: Duration,
    /// The last handshake failure logged at WARN, so a peer that keeps
    /// refusing us is logged once, not on every retry.
    warned: Arc<std::sync::Mutex<Option<String>>>,
}

impl fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConnector")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("server_name", &self.server_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl TlsConnector {
    /// A connector to `host:port` (an IPv6 host may be written with or
    /// without brackets) that expects the server's certificate to be valid
    /// for `server_name`, or for `host` when that is `None`.
    pub fn new(
        host: String,
        port: u16,
        server_name: Option<String>,
        identity: &TlsIdentity,
        connect_timeout: Duration,
        handshake_timeout: Duration,
    ) -> Result<TlsConnector, TunnelError> {
        let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(inner) => inner.to_owned(),
            None => host,
        };
        let name = server_name.unwrap_or_else(|| host.clone());
        let server_name =
            ServerName::try_from(name.clone()).map_err(|_| TunnelError::InvalidServerName(name))?;
        Ok(TlsConnector {
            host,
            port,
            server_name,
            connector: tokio_rustls::TlsConnector::from(identity.client_config()),
            connect_timeout,
            handshake_timeout,
            warned: Arc::default(),
        })
    }

    /// Logs a failed handshake at WARN, once until the error changes or a
    /// handshake succeeds: a certificate the peer or we refuse is then
    /// visible without `--log debug`.
    fn handshake_failed(&self, e: io::Error) -> io::Error {
        let text = e.to_string();
        let mut warned = self
            .warned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if warned.as_deref() != Some(text.as_str()) {
            tracing::warn!("{text}");
            *warned = Some(text);
        }
        e
    }

    /// HOST:PORT as text, with brackets around an IPv6 address.
    fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Connects and runs the handshake; returns the TLS stream and the name
    /// in the server's (verified) certificate.
    pub async fn open(&self) -> io::Result<(tokio_rustls::client::TlsStream<TcpStream>, String)> {
        let address = self.address();
        let tcp = tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "connecting to {address} timed out after {:?}",
                    self.connect_timeout
                ),
            )
        })?
        .map_err(|e| io::Error::new(e.kind(), format!("connecting to {address} failed: {e}")))?;
        tcp.set_nodelay(true)?;
        let tls = tokio::time::timeout(
            self.handshake_timeout,
            self.connector.connect(self.server_name.clone(), tcp),
        )
        .await
        .map_err(|_| {
            self.handshake_failed(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "TLS handshake with {address} timed out after {:?}",
                    self.handshake_timeout
                ),
            ))
        })?
        .map_err(|e| {
            let failed = format!("TLS handshake with {address} failed");
            self.handshake_failed(match crate::refusal::refusal(&e) {
                // Not worth retrying: the RPC client fails its calls at once.
                Some(why) => Refusal(format!("{failed}: {why}")).into(),
                None => io::Error::new(e.kind(), format!("{failed}: {e}")),
            })
        })?;
        let name = match tls.get_ref().1.peer_certificates() {
            Some([end_entity, ..]) => peer_name(end_entity),
            _ => None,
        };
        let name = name.ok_or_else(|| {
            self.handshake_failed(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("TLS handshake with {address} failed: the server certificate has no name"),
            ))
        })?;
        if let Ok(mut warned) = self.warned.lock() {
            *warned = None;
        }
        Ok((tls, name))
    }
}

impl Connector for TlsConnector {
    fn connect(&self) -> BoxFuture<'_, io::Result<BoxStream>> {
        Box::pin(async move {
            let (tls, server) = self.open().await?;
            tracing::debug!(upstream = %self.address(), server, "TLS connection up");
            Ok(Box::new(tls) as BoxStream)
        })
    }

    /// A TLS alert from the server (with TLS 1.3, one rejecting our
    /// certificate comes on the first read, after the handshake) or a
    /// server certificate we rejected.
    fn refusal(&self, e: &io::Error) -> Option<String> {
        crate::refusal::refusal(e).or_else(|| refusal_of(e))
    }

    fn describe(&self) -> String {
        let address = self.address();
        let name = self.server_name.to_str();
        if name == self.host {
            format!("{address} (TLS)")
        } else {
            format!("{address} (TLS, server name {name})")
        }
    }
}
