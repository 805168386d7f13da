//! The `nfs://HOST[:PORT]/EXPORT[?mountport=N]` upstream: any NFSv3 server
//! (nfs-ganesha, Linux knfsd, another gvfs-proxy).
//!
//! Calls are forwarded with the caller's own credentials, and file handles
//! pass through unchanged, so chains of proxies work with any handle size.
//! One connection carries many calls at once (see `gvfs_nfs::net::client`); ports
//! not given in the URL are asked of the server's portmapper at HOST:111 on
//! every (re)connect, so a server that restarts on a new port is found again.
//!
//! The `gvfs://HOST:PORT[/EXPORT][?name=NAME]` upstream is the same client
//! over mutually authenticated TLS 1.3 to another gvfs-proxy's
//! `--listen-tls` port, which serves MOUNT and NFS on that one port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gvfs_nfs::net::client::{
    BoxStream, ClientConfig, ClientError, Connector, RpcClient, TcpConnector,
};
use gvfs_nfs::nfs3_types::nfs3::nfs_fh3;
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::portmap::{self, IPPROTO_TCP, Mapping};
use gvfs_nfs::proc::{MAX_FH_LEN, NfsProc, raw};
use gvfs_nfs::rpc::Reply;
use gvfs_nfs::xdr::{self, XdrReader};
use gvfs_nfs::{BoxFuture, CallContext, NfsReply, NfsRequest, NfsService, ServiceError};

use gvfs_nfs::proc::{MOUNT_PROGRAM, NFS_PROGRAM};

/// The default export name, also what a `gvfs://` URL without one mounts.
pub const DEFAULT_EXPORT: &str = "/export";

/// A parsed `nfs://` upstream URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsUrl {
    /// Host name or address.
    pub host: String,
    /// NFS port; `None` asks the portmapper.
    pub port: Option<u16>,
    /// MOUNT port; `None` asks the portmapper.
    pub mount_port: Option<u16>,
    /// Export path to mount, starting with `/`.
    pub export: String,
}

/// Why an upstream URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad {scheme} URL {url:?}: {reason}")]
pub struct BadUrl {
    scheme: &'static str,
    url: String,
    reason: String,
}

impl NfsUrl {
    /// Parses `nfs://HOST[:PORT]/EXPORT[?mountport=N][&nfsport=N]`.
    pub fn parse(url: &str) -> Result<Self, BadUrl> {
        let bad = |reason: &str| BadUrl {
            scheme: "nfs://",
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let rest = url
            .strip_prefix("nfs://")
            .ok_or_else(|| bad("must start with nfs://"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let slash = rest
            .find('/')
            .ok_or_else(|| bad("missing /EXPORT after the host"))?;
        let (authority, export) = rest.split_at(slash);
        let (host, port) = split_host_port(authority).ok_or_else(|| bad("bad HOST[:PORT]"))?;
        if host.is_empty() {
            return Err(bad("missing host"));
        }
        let mut u = Self {
            host: host.to_string(),
            port,
            mount_port: None,
            export: export.to_string(),
        };
        for kv in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|s| !s.is_empty())
        {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad("query must be key=value"))?;
            let port = || {
                v.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad("bad port number"))
            };
            match k {
                "mountport" => u.mount_port = Some(port()?),
                "nfsport" => u.port = Some(port()?),
                "version" if v == "3" => {}
                _ => return Err(bad(&format!("unknown or unsupported option {k}={v}"))),
            }
        }
        Ok(u)
    }
}

/// A parsed `gvfs://` upstream URL: another gvfs-proxy's TLS port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GvfsUrl {
    /// Host name or address.
    pub host: String,
    /// The peer's `--listen-tls` port.
    pub port: u16,
    /// Export path to mount [default: /export].
    pub export: String,
    /// The name the server's certificate must carry, if not `host`.
    pub server_name: Option<String>,
}

impl GvfsUrl {
    /// Parses `gvfs://HOST:PORT[/EXPORT][?name=NAME]`.
    pub fn parse(url: &str) -> Result<Self, BadUrl> {
        let bad = |reason: &str| BadUrl {
            scheme: "gvfs://",
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let rest = url
            .strip_prefix("gvfs://")
            .ok_or_else(|| bad("must start with gvfs://"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, export) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, DEFAULT_EXPORT),
        };
        let (host, port) = split_host_port(authority).ok_or_else(|| bad("bad HOST:PORT"))?;
        let port =
            port.ok_or_else(|| bad("needs the peer's --listen-tls port: gvfs://HOST:PORT"))?;
        if host.is_empty() {
            return Err(bad("missing host"));
        }
        let mut u = Self {
            host: host.to_string(),
            port,
            export: export.to_string(),
            server_name: None,
        };
        for kv in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|s| !s.is_empty())
        {
            match kv.split_once('=') {
                Some(("name", v)) if !v.is_empty() => u.server_name = Some(v.to_string()),
                _ => return Err(bad(&format!("unknown option {kv:?} (known: name=NAME)"))),
            }
        }
        Ok(u)
    }
}

fn split_host_port(a: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = a.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(p) => Some((host, Some(p.parse().ok().filter(|p| *p != 0)?))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    match a.rsplit_once(':') {
        Some((h, p)) => Some((h, Some(p.parse().ok().filter(|p| *p != 0)?))),
        None => Some((a, None)),
    }
}

/// Timeouts for talking to the upstream.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamTimeouts {
    /// One connection attempt.
    pub connect: Duration,
    /// Give up on a call after this long (`None`: wait like a hard mount).
    pub give_up_after: Option<Duration>,
}

/// Connects to one program of the server, asking its portmapper for the
/// port when the URL did not give one.
struct ProgramConnector {
    host: String,
    port: Option<u16>,
    prog: u32,
    vers: u32,
    connect_timeout: Duration,
}

impl ProgramConnector {
    async fn resolve(&self, port: u16) -> std::io::Result<SocketAddr> {
        tokio::net::lookup_host((self.host.as_str(), port))
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{} has no address", self.host)))
    }

    fn program_name(&self) -> &'static str {
        match self.prog {
            NFS_PROGRAM => "NFS",
            MOUNT_PROGRAM => "MOUNT",
            _ => "the",
        }
    }

    async fn ask_portmapper(&self) -> std::io::Result<u16> {
        let addr = self.resolve(111).await?;
        // Connect once here, so a portmapper that refuses or does not
        // answer is reported as such rather than as a call that ran out of
        // time.
        let unreachable = |e: &dyn std::fmt::Display| {
            format!(
                "cannot reach the portmapper at {addr} to find the {} port: {e} \
                 (give the ports in the URL: nfs://HOST:PORT/EXPORT?mountport=N)",
                self.program_name()
            )
        };
        let stream = tokio::time::timeout(self.connect_timeout, TcpConnector { addr }.connect())
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    unreachable(&format_args!("timed out after {:?}", self.connect_timeout)),
                )
            })?
            .map_err(|e| std::io::Error::new(e.kind(), unreachable(&e)))?;
        let pm = RpcClient::new(
            OneStream(std::sync::Mutex::new(Some(stream)), addr),
            ClientConfig {
                connect_timeout: self.connect_timeout,
                retransmit_after: self.connect_timeout,
                give_up_after: Some(self.connect_timeout),
                max_in_flight: 1,
                ..ClientConfig::default()
            },
        );
        let mut args = Vec::new();
        Mapping {
            prog: self.prog,
            vers: self.vers,
            prot: IPPROTO_TCP,
            port: 0,
        }
        .encode(&mut args);
        let reply = pm
            .call(
                portmap::PROGRAM,
                portmap::VERSION,
                portmap::procs::GETPORT,
                &Default::default(),
                &args,
            )
            .await
            .map_err(|e| std::io::Error::other(format!("portmapper at {addr}: {e}")))?;
        match portmap::decode_port(&reply) {
            Ok(p) if p > 0 && p <= u32::from(u16::MAX) => Ok(p as u16),
            Ok(_) => Err(std::io::Error::other(format!(
                "portmapper at {addr} knows no program {} version {} over TCP",
                self.prog, self.vers
            ))),
            Err(e) => Err(std::io::Error::other(format!("portmapper at {addr}: {e}"))),
        }
    }
}

impl Connector for ProgramConnector {
    fn connect(&self) -> BoxFuture<'_, std::io::Result<BoxStream>> {
        Box::pin(async move {
            let port = match self.port {
                Some(p) => p,
                None => self.ask_portmapper().await?,
            };
            let addr = self.resolve(port).await?;
            TcpConnector { addr }.connect().await.map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "connecting to {} at {addr} failed: {e}",
                        self.program_name()
                    ),
                )
            })
        })
    }

    fn describe(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{p}", self.host),
            None => format!("{} (port from portmapper)", self.host),
        }
    }
}

/// Hands out one already connected stream, once: the portmapper query.
struct OneStream(std::sync::Mutex<Option<BoxStream>>, SocketAddr);

impl Connector for OneStream {
    fn connect(&self) -> BoxFuture<'_, std::io::Result<BoxStream>> {
        let stream = self.0.lock().ok().and_then(|mut s| s.take());
        Box::pin(async move {
            stream.ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    format!("the portmapper at {} closed the connection", self.1),
                )
            })
        })
    }

    fn describe(&self) -> String {
        self.1.to_string()
    }
}

/// The last error of the connection attempts of an upstream's connectors,
/// cleared by a successful one; what a start-up check that timed out
/// reports as the reason.
type LastConnectError = Arc<std::sync::Mutex<Option<String>>>;

/// Wraps a connector to note its failures in a [`LastConnectError`].
struct Recording<C> {
    inner: C,
    last: LastConnectError,
    connect_timeout: Duration,
}

impl<C: Connector> Connector for Recording<C> {
    fn connect(&self) -> BoxFuture<'_, std::io::Result<BoxStream>> {
        Box::pin(async move {
            let result = tokio::time::timeout(self.connect_timeout, self.inner.connect())
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "connecting to {} timed out after {:?}",
                            self.inner.describe(),
                            self.connect_timeout
                        ),
                    ))
                });
            if let Ok(mut last) = self.last.lock() {
                *last = result.as_ref().err().map(|e| e.to_string());
            }
            result
        })
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn refusal(&self, e: &std::io::Error) -> Option<String> {
        self.inner.refusal(e)
    }
}

/// Forwards every call to an NFSv3 server.
#[derive(Debug)]
pub struct NfsUpstream {
    description: String,
    export: String,
    nfs: RpcClient,
    mount: RpcClient,
    last_connect_error: LastConnectError,
}

impl NfsUpstream {
    /// An upstream for `url`; connects lazily (see [`check`](Self::check)).
    pub fn new(url: NfsUrl, timeouts: UpstreamTimeouts) -> Self {
        let connector = |port, prog| ProgramConnector {
            host: url.host.clone(),
            port,
            prog,
            vers: 3,
            connect_timeout: timeouts.connect,
        };
        let port = url.port.map(|p| format!(":{p}")).unwrap_or_default();
        Self::over(
            format!("nfs://{}{}{}", url.host, port, url.export),
            url.export.clone(),
            connector(url.port, NFS_PROGRAM),
            connector(url.mount_port, MOUNT_PROGRAM),
            timeouts,
        )
    }

    /// An upstream for `url` over TLS with `identity`: MOUNT and NFS on the
    /// peer's one TLS port, on two connections.
    pub fn tls(
        url: &GvfsUrl,
        identity: &gvfs_tunnel::TlsIdentity,
        timeouts: UpstreamTimeouts,
        handshake_timeout: Duration,
    ) -> Result<Self, gvfs_tunnel::TunnelError> {
        let connector = || {
            gvfs_tunnel::TlsConnector::new(
                url.host.clone(),
                url.port,
                url.server_name.clone(),
                identity,
                timeouts.connect,
                handshake_timeout,
            )
        };
        Ok(Self::over(
            format!("gvfs://{}:{}{}", url.host, url.port, url.export),
            url.export.clone(),
            connector()?,
            connector()?,
            timeouts,
        ))
    }

    fn over(
        description: String,
        export: String,
        nfs: impl Connector,
        mount: impl Connector,
        timeouts: UpstreamTimeouts,
    ) -> Self {
        let config = |max_in_flight| ClientConfig {
            connect_timeout: timeouts.connect,
            give_up_after: timeouts.give_up_after,
            max_in_flight,
            ..ClientConfig::default()
        };
        let last = LastConnectError::default();
        let nfs = Recording {
            inner: nfs,
            last: last.clone(),
            connect_timeout: timeouts.connect,
        };
        let mount = Recording {
            inner: mount,
            last: last.clone(),
            connect_timeout: timeouts.connect,
        };
        Self {
            description,
            export,
            nfs: RpcClient::new(nfs, config(128)),
            mount: RpcClient::new(mount, config(4)),
            last_connect_error: last,
        }
    }

    /// The NFS client's counters.
    pub fn client(&self) -> &RpcClient {
        &self.nfs
    }

    /// Mounts the export once, within `within`, to fail early with a clear
    /// message when the upstream is unreachable or refuses the export. An
    /// upstream that does not answer in time is reported with the last
    /// connection error (refused, TLS certificate rejected, ...), if any.
    pub async fn check(&self, cx: &CallContext, within: Duration) -> Result<(), ServiceError> {
        let last = || self.last_connect_error.lock().ok().and_then(|l| l.clone());
        let unavailable = |reason| ServiceError::UpstreamUnavailable {
            upstream: self.describe(),
            reason,
        };
        match tokio::time::timeout(within, self.root(cx)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(ServiceError::UpstreamUnavailable { reason, .. })) => match last() {
                Some(e) if !reason.contains(&e) => Err(unavailable(format!(
                    "{reason}; last connection attempt: {e}"
                ))),
                _ => Err(unavailable(reason)),
            },
            Ok(Err(e)) => Err(e),
            Err(_) => Err(unavailable(match last() {
                Some(e) => format!("not reached within {within:?}; last connection attempt: {e}"),
                None => format!("no answer within {within:?}"),
            })),
        }
    }

    fn service_error(&self, e: ClientError) -> ServiceError {
        let upstream = self.describe();
        match e {
            ClientError::Unavailable { .. } => ServiceError::UpstreamUnavailable {
                upstream,
                reason: e.to_string(),
            },
            ClientError::Refused { .. } => ServiceError::UpstreamRefused {
                upstream,
                reason: e.to_string(),
            },
            ClientError::Rpc { error, .. } => match error {
                gvfs_nfs::rpc::ReplyError::Accepted(status)
                | gvfs_nfs::rpc::ReplyError::Denied(status) => {
                    ServiceError::UpstreamRejected { upstream, status }
                }
                other => ServiceError::UpstreamProtocol {
                    upstream,
                    reason: other.to_string(),
                },
            },
            _ => ServiceError::UpstreamProtocol {
                upstream,
                reason: e.to_string(),
            },
        }
    }
}

impl NfsService for NfsUpstream {
    fn call<'a>(
        &'a self,
        cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(async move {
            let p = req.proc_();
            // A client waits for it: the extension client's background
            // and bulk fetches on the same link make way.
            let _waited = self.nfs.link().foreground();
            let results = self
                .nfs
                .call_with(NFS_PROGRAM, 3, p as u32, &cx.cred, |out| req.encode(out))
                .await
                .map_err(|e| self.service_error(e))?;
            NfsReply::decode(p, &results).map_err(|e| ServiceError::UpstreamProtocol {
                upstream: self.describe(),
                reason: format!("{} reply: {e}", p.name()),
            })
        })
    }

    fn root<'a>(&'a self, cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        Box::pin(async move {
            let mut args = Vec::new();
            xdr::put_opaque(&mut args, self.export.as_bytes());
            let reply = self
                .mount
                .call(MOUNT_PROGRAM, 3, 1, &cx.cred, &args)
                .await
                .map_err(|e| self.service_error(e))?;
            let protocol = |reason: &str| ServiceError::UpstreamProtocol {
                upstream: self.describe(),
                reason: format!("MNT reply: {reason}"),
            };
            let mut r = XdrReader::new(&reply);
            match r.u32().map_err(|_| protocol("truncated"))? {
                0 => {
                    let fh = r
                        .opaque(MAX_FH_LEN)
                        .map_err(|_| protocol("bad file handle"))?;
                    Ok(nfs_fh3 {
                        data: Opaque::owned(fh.to_vec()),
                    })
                }
                status => Err(ServiceError::MountRefused(gvfs_nfs::service::MountStatus(
                    status,
                ))),
            }
        })
    }

    fn forward_raw<'a>(
        &'a self,
        cx: &'a CallContext,
        p: NfsProc,
        args: &'a [u8],
    ) -> Option<BoxFuture<'a, Result<Reply, ServiceError>>> {
        Some(Box::pin(async move {
            let results = self
                .nfs
                .call(NFS_PROGRAM, 3, p as u32, &cx.cred, args)
                .await
                .map_err(|e| self.service_error(e))?;
            let checked = match p {
                NfsProc::Read => raw::read_results(&results).map(|_| ()),
                NfsProc::Write => raw::write_results(&results),
                _ => NfsReply::decode(p, &results)
                    .map(|_| ())
                    .map_err(|_| gvfs_nfs::xdr::XdrError::InvalidValue(p as u32)),
            };
            checked.map_err(|e| ServiceError::UpstreamProtocol {
                upstream: self.describe(),
                reason: format!("{} reply: {e}", p.name()),
            })?;
            Ok(results)
        }))
    }

    fn describe(&self) -> String {
        self.description.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = NfsUrl::parse("nfs://127.0.0.1:20490/export?mountport=20048").unwrap();
        assert_eq!(u.host, "127.0.0.1");
        assert_eq!((u.port, u.mount_port), (Some(20490), Some(20048)));
        assert_eq!(u.export, "/export");
        let u = NfsUrl::parse("nfs://filer/srv/images").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.export.as_str()),
            ("filer", None, "/srv/images")
        );
        let u = NfsUrl::parse("nfs://[::1]:2049/").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.export.as_str()),
            ("::1", Some(2049), "/")
        );
        let u = NfsUrl::parse("nfs://h/e?nfsport=1&mountport=2&version=3").unwrap();
        assert_eq!((u.port, u.mount_port), (Some(1), Some(2)));
    }

    #[test]
    fn parses_gvfs_urls() {
        let u = GvfsUrl::parse("gvfs://10.0.0.1:20049/images?name=image-server").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("10.0.0.1", 20049));
        assert_eq!(u.export, "/images");
        assert_eq!(u.server_name.as_deref(), Some("image-server"));
        let u = GvfsUrl::parse("gvfs://peer:1").unwrap();
        assert_eq!((u.export.as_str(), u.server_name), ("/export", None));
        for bad in [
            "gvfs://peer/export",
            "gvfs://:1/e",
            "gvfs://p:0/e",
            "gvfs://p:1/e?x=y",
            "nfs://p:1/e",
        ] {
            assert!(GvfsUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn url_errors_name_the_scheme_given() {
        let e = GvfsUrl::parse("gvfs://peer/export")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("bad gvfs:// URL \"gvfs://peer/export\": "),
            "{e}"
        );
        assert!(e.contains("--listen-tls port"), "{e}");
        let e = NfsUrl::parse("nfs://h").unwrap_err().to_string();
        assert!(e.starts_with("bad nfs:// URL \"nfs://h\": "), "{e}");
    }

    #[test]
    fn refuses_bad_urls() {
        for bad in [
            "http://h/e",
            "nfs://h",
            "nfs:///e",
            "nfs://h:0/e",
            "nfs://h:99999/e",
            "nfs://h/e?mountport=x",
            "nfs://h/e?version=4",
            "nfs://h/e?foo",
        ] {
            assert!(NfsUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
