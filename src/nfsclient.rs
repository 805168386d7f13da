//! A small NFSv3 client for tests that need calls libnfs cannot make
//! (exclusive create with a chosen verifier, LINK, SETATTR guards, raw
//! READDIR cookies): our `gvfs_nfs` RPC client and typed procedures, aimed
//! at any server (nfs-ganesha, a proxy).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use gvfs_nfs::net::client::{ClientConfig, RpcClient, TcpConnector};
use gvfs_nfs::nfs3_types::nfs3::{
    COMMIT3args, CREATE3args, CREATE3resok, LOOKUP3args, Nfs3Option, Nfs3Result, WRITE3args,
    createhow3, diropargs3, filename3, nfs_fh3, sattr3, stable_how, writeverf3,
};
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::xdr::{self, XdrReader};
use gvfs_nfs::{Credentials, NfsReply, NfsRequest};

/// An NFSv3 client bound to one export.
#[derive(Debug, Clone)]
pub struct NfsClient {
    nfs: RpcClient,
    /// The export's root handle.
    pub root: nfs_fh3,
    /// Credentials sent with every call.
    pub cred: Credentials,
}

fn client(addr: SocketAddr, give_up: Duration) -> RpcClient {
    RpcClient::new(
        TcpConnector { addr },
        ClientConfig {
            give_up_after: Some(give_up),
            retransmit_after: give_up,
            ..ClientConfig::default()
        },
    )
}

impl NfsClient {
    /// Mounts `export` through the MOUNT service at `mount` and talks NFS to
    /// `nfs`, as `cred`; calls give up after `give_up`.
    pub async fn mount(
        nfs: SocketAddr,
        mount: SocketAddr,
        export: &str,
        cred: Credentials,
        give_up: Duration,
    ) -> Result<Self> {
        let m = client(mount, give_up);
        let mut args = Vec::new();
        xdr::put_opaque(&mut args, export.as_bytes());
        let reply = m
            .call(gvfs_nfs::proc::MOUNT_PROGRAM, 3, 1, &cred, &args)
            .await
            .with_context(|| format!("MNT {export} at {mount}"))?;
        let mut r = XdrReader::new(&reply);
        let status = r.u32()?;
        if status != 0 {
            bail!("MNT {export} at {mount}: mount status {status}");
        }
        let fh = r.opaque(64)?.to_vec();
        Ok(Self {
            nfs: client(nfs, give_up),
            root: nfs_fh3 {
                data: Opaque::owned(fh),
            },
            cred,
        })
    }

    /// Mounts a gvfs-proxy's export as root (AUTH_UNIX 0:0); NFS and MOUNT
    /// share the proxy's port.
    pub async fn of_proxy(proxy: &crate::Proxy, give_up: Duration) -> Result<Self> {
        let a = proxy.addr();
        Self::mount(a, a, proxy.export(), Credentials::unix(0, 0), give_up).await
    }

    /// Creates (UNCHECKED) `name` in the export's root and returns its handle.
    pub async fn create(&self, name: &str) -> Result<nfs_fh3> {
        let reply = self
            .call(NfsRequest::Create(CREATE3args {
                where_: diropargs3 {
                    dir: self.root.clone(),
                    name: filename3::from(name.as_bytes().to_vec()),
                },
                how: createhow3::UNCHECKED(sattr3::default()),
            }))
            .await?;
        match reply {
            NfsReply::Create(Nfs3Result::Ok(CREATE3resok {
                obj: Nfs3Option::Some(fh),
                ..
            })) => Ok(fh),
            other => bail!("CREATE {name}: {:?}", other.status()),
        }
    }

    /// WRITE `data` at `offset` of `fh` (`stable` as given); the reply's
    /// write verifier.
    pub async fn write(
        &self,
        fh: &nfs_fh3,
        offset: u64,
        data: &[u8],
        stable: stable_how,
    ) -> Result<writeverf3> {
        let reply = self
            .call(NfsRequest::Write(WRITE3args {
                file: fh.clone(),
                offset,
                count: data.len() as u32,
                stable,
                data: Opaque::owned(data.to_vec()),
            }))
            .await?;
        match reply {
            NfsReply::Write(Nfs3Result::Ok(ok)) => Ok(ok.verf),
            other => bail!("WRITE at {offset}: {:?}", other.status()),
        }
    }

    /// COMMIT all of `fh`; the reply's write verifier.
    pub async fn commit(&self, fh: &nfs_fh3) -> Result<writeverf3> {
        let reply = self
            .call(NfsRequest::Commit(COMMIT3args {
                file: fh.clone(),
                offset: 0,
                count: 0,
            }))
            .await?;
        match reply {
            NfsReply::Commit(Nfs3Result::Ok(ok)) => Ok(ok.verf),
            other => bail!("COMMIT: {:?}", other.status()),
        }
    }

    /// Runs one call and decodes its reply.
    pub async fn call(&self, req: NfsRequest) -> Result<NfsReply> {
        let p = req.proc_();
        let mut args = Vec::new();
        req.encode(&mut args);
        let results = self
            .nfs
            .call(gvfs_nfs::proc::NFS_PROGRAM, 3, p as u32, &self.cred, &args)
            .await
            .with_context(|| format!("{} to {}", p.name(), self.nfs.server()))?;
        NfsReply::decode(p, &results).with_context(|| format!("decoding {} reply", p.name()))
    }

    /// The RPC client (for raw calls and counters).
    pub fn rpc(&self) -> &RpcClient {
        &self.nfs
    }

    /// Looks `name` up in `dir`: `Ok(None)` when the server says it is not
    /// there (any error status).
    pub async fn lookup(&self, dir: &nfs_fh3, name: &str) -> Result<Option<nfs_fh3>> {
        let reply = self
            .call(NfsRequest::Lookup(LOOKUP3args {
                what: diropargs3 {
                    dir: dir.clone(),
                    name: filename3::from(name.as_bytes().to_vec()),
                },
            }))
            .await?;
        Ok(match reply {
            NfsReply::Lookup(Nfs3Result::Ok(ok)) => Some(ok.object),
            _ => None,
        })
    }

    /// Resolves a `/`-separated path below the root.
    pub async fn resolve(&self, path: &str) -> Result<Option<nfs_fh3>> {
        let mut fh = self.root.clone();
        for name in path.split('/').filter(|n| !n.is_empty()) {
            match self.lookup(&fh, name).await? {
                Some(next) => fh = next,
                None => return Ok(None),
            }
        }
        Ok(Some(fh))
    }
}
