//! The extension program spoken to an upstream over its NFS connection.

use std::sync::Arc;
use std::time::Duration;

use gvfs_nfs::net::client::{ClientError, RpcClient};
use gvfs_nfs::nfs3_types::nfs3::{fattr3, nfsstat3};
use gvfs_nfs::rpc::{ReplyError, ReplyStatus};
use gvfs_nfs::xdr::put_opaque;
use gvfs_nfs::{BoxFuture, Credentials};

use crate::error::FetchError;
use crate::fetch::{
    FetchArgs, FetchOk, decode_fetch_repeats_res, decode_fetch_res, encode_have_args,
};
use crate::profile::{self, Profile};
use crate::proto::*;
use crate::source::ChunkSource;
use crate::store::{StoreArgs, decode_store_res};

/// The extension program spoken to an upstream over its NFS connection.
pub struct ExtClient {
    client: RpcClient,
    /// Whether the upstream speaks the program, once it has answered;
    /// callers that come while it is being asked wait for that answer.
    speaks: tokio::sync::OnceCell<bool>,
    /// Longest wait for that answer ([`PROBE_TIMEOUT`]).
    probe_timeout: Duration,
    /// Whether to ask with FETCH_REPEATS (until the upstream refuses it).
    repeats: std::sync::atomic::AtomicBool,
    /// Whether to store with STORE_GUARDED (until the upstream refuses it).
    guards: std::sync::atomic::AtomicBool,
    /// Whether to ask demand with FETCH_DEMAND (until the upstream refuses it).
    demand: std::sync::atomic::AtomicBool,
    /// Whether the upstream keeps profiles (until it refuses PROFILE_*).
    profiles: std::sync::atomic::AtomicBool,
    /// Whether to say which blocks are held with FETCH_HAVE (until the
    /// upstream refuses it).
    have: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for ExtClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtClient")
            .field("server", &self.client.server())
            .finish()
    }
}

impl ExtClient {
    /// The program over `client`'s connection.
    pub fn new(client: RpcClient) -> Arc<Self> {
        Arc::new(Self::with_probe_timeout(client, PROBE_TIMEOUT))
    }

    /// The program over `client`'s connection, waiting at most
    /// `probe_timeout` for the upstream to say whether it speaks it.
    pub(crate) fn with_probe_timeout(client: RpcClient, probe_timeout: Duration) -> Self {
        Self {
            client,
            speaks: tokio::sync::OnceCell::new(),
            probe_timeout,
            repeats: std::sync::atomic::AtomicBool::new(true),
            guards: std::sync::atomic::AtomicBool::new(true),
            demand: std::sync::atomic::AtomicBool::new(true),
            profiles: std::sync::atomic::AtomicBool::new(true),
            have: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Calls `proc_` unless the upstream refused it before (`flag`); on
    /// PROC_UNAVAIL notes that in `flag` and answers `Ok(None)`.
    async fn call_new(
        &self,
        flag: &std::sync::atomic::AtomicBool,
        proc_: u32,
        cred: &Credentials,
        args: &[u8],
    ) -> Result<Option<Vec<u8>>, FetchError> {
        use std::sync::atomic::Ordering::Relaxed;
        if !flag.load(Relaxed) {
            return Ok(None);
        }
        match self.client.call(PROGRAM, VERSION, proc_, cred, args).await {
            Ok(reply) => Ok(Some(reply.to_vec())),
            Err(ClientError::Rpc {
                error: ReplyError::Accepted(ReplyStatus::ProcUnavail),
                ..
            }) => {
                tracing::info!(
                    server = %self.client.server(),
                    proc_,
                    "upstream does not know this extension procedure (an older gvfs-proxy)"
                );
                flag.store(false, Relaxed);
                Ok(None)
            }
            Err(e) => Err(FetchError::Transport(e)),
        }
    }

    async fn call(
        &self,
        proc_: u32,
        cred: &Credentials,
        args: &[u8],
    ) -> Result<Vec<u8>, FetchError> {
        match self.client.call(PROGRAM, VERSION, proc_, cred, args).await {
            Ok(reply) => Ok(reply.to_vec()),
            Err(e) => Err(FetchError::Transport(e)),
        }
    }

    /// Sends the extension's NULL: `Ok` with whether the upstream speaks
    /// it, `Err` when no answer came (ask again next time).
    async fn probe(&self) -> Result<bool, ()> {
        let cred = Credentials::default();
        let call = self.client.call(PROGRAM, VERSION, PROC_NULL, &cred, &[]);
        match tokio::time::timeout(self.probe_timeout, call).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(ClientError::Rpc { error, .. })) => {
                tracing::info!(
                    server = %self.client.server(),
                    "upstream does not speak the gvfs extension ({error}); \
                     compress-and-copy files are read block by block"
                );
                Ok(false)
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "extension probe got no answer");
                Err(())
            }
            Err(_) => {
                tracing::debug!(after = ?self.probe_timeout, "extension probe got no answer");
                Err(())
            }
        }
    }
}

impl ChunkSource for ExtClient {
    fn fetch<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a FetchArgs,
        urgency: Urgency,
    ) -> BoxFuture<'a, Result<FetchOk, FetchError>> {
        Box::pin(async move {
            let mut buf = Vec::with_capacity(args.fh.len() + 24);
            args.encode(&mut buf);
            let with_repeats = self.repeats.load(std::sync::atomic::Ordering::Relaxed);
            let held = match &args.have {
                Some(have) if with_repeats && !have.is_empty() => {
                    let mut buf = Vec::with_capacity(buf.len() + 48);
                    encode_have_args(&mut buf, args, have, urgency == Urgency::Demand);
                    self.call_new(&self.have, PROC_FETCH_HAVE, cred, &buf)
                        .await?
                }
                _ => None,
            };
            let demand = if held.is_some() {
                held
            } else if urgency == Urgency::Demand && with_repeats {
                self.call_new(&self.demand, PROC_FETCH_DEMAND, cred, &buf)
                    .await?
            } else {
                None
            };
            let (bytes, with_repeats) = if let Some(bytes) = demand {
                (bytes, true)
            } else if with_repeats {
                let call = self
                    .client
                    .call(PROGRAM, VERSION, PROC_FETCH_REPEATS, cred, &buf)
                    .await;
                match call {
                    Ok(reply) => (reply.to_vec(), true),
                    Err(ClientError::Rpc {
                        error: ReplyError::Accepted(ReplyStatus::ProcUnavail),
                        ..
                    }) => {
                        tracing::info!(
                            server = %self.client.server(),
                            "upstream does not know FETCH_REPEATS; using FETCH"
                        );
                        self.repeats
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                        (self.call(PROC_FETCH, cred, &buf).await?, false)
                    }
                    Err(e) => return Err(FetchError::Transport(e)),
                }
            } else {
                (self.call(PROC_FETCH, cred, &buf).await?, false)
            };
            let decoded = if with_repeats {
                decode_fetch_repeats_res(&bytes)
            } else {
                decode_fetch_res(&bytes)
            };
            match decoded {
                Ok(Ok(ok)) => Ok(ok),
                Ok(Err(st)) => Err(FetchError::Nfs(st)),
                Err(source) => Err(FetchError::BadReply {
                    server: self.client.server(),
                    call: "FETCH",
                    source,
                }),
            }
        })
    }

    fn store<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a StoreArgs,
    ) -> BoxFuture<'a, Result<fattr3, FetchError>> {
        Box::pin(async move {
            let mut buf = Vec::with_capacity(args.fh.len() + args.data.len() + 56);
            args.encode(&mut buf);
            let guarded = args.guard.is_some();
            let bytes = if guarded && self.guards.load(std::sync::atomic::Ordering::Relaxed) {
                let call = self
                    .client
                    .call(PROGRAM, VERSION, PROC_STORE_GUARDED, cred, &buf)
                    .await;
                match call {
                    Ok(reply) => reply.to_vec(),
                    Err(ClientError::Rpc {
                        error: ReplyError::Accepted(ReplyStatus::ProcUnavail),
                        ..
                    }) => {
                        tracing::warn!(
                            server = %self.client.server(),
                            "upstream does not know STORE_GUARDED (an older gvfs-proxy): \
                             write-backs of whole files cannot check that the origin is \
                             unchanged and may overwrite changes made there"
                        );
                        self.guards
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                        buf.truncate(buf.len() - GUARD_LEN);
                        self.call(PROC_STORE, cred, &buf).await?
                    }
                    Err(e) => return Err(FetchError::Transport(e)),
                }
            } else {
                if guarded {
                    // STORE's arguments: without the guard at the end.
                    buf.truncate(buf.len() - GUARD_LEN);
                }
                self.call(PROC_STORE, cred, &buf).await?
            };
            match decode_store_res(&bytes) {
                Ok(Ok(attrs)) => Ok(attrs),
                Ok(Err(st)) => Err(FetchError::Nfs(st)),
                Err(source) => Err(FetchError::BadReply {
                    server: self.client.server(),
                    call: "STORE",
                    source,
                }),
            }
        })
    }

    fn supported(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            let answer = self.speaks.get_or_try_init(|| self.probe()).await;
            answer.is_ok_and(|yes| *yes)
        })
    }

    fn put_profile<'a>(
        &'a self,
        cred: &'a Credentials,
        fh: &'a [u8],
        profile: &'a Profile,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        Box::pin(async move {
            let mut buf = Vec::new();
            profile::encode_put(&mut buf, fh, profile);
            let Some(bytes) = self
                .call_new(&self.profiles, PROC_PROFILE_PUT, cred, &buf)
                .await?
            else {
                return Ok(());
            };
            match gvfs_nfs::xdr::decode_exact::<nfsstat3>(&bytes) {
                Ok(nfsstat3::NFS3_OK) => Ok(()),
                Ok(st) => Err(FetchError::Nfs(st)),
                Err(source) => Err(FetchError::BadReply {
                    server: self.client.server(),
                    call: "PROFILE_PUT",
                    source,
                }),
            }
        })
    }

    fn get_profile<'a>(
        &'a self,
        cred: &'a Credentials,
        fh: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<Profile>, FetchError>> {
        Box::pin(async move {
            let mut buf = Vec::new();
            put_opaque(&mut buf, fh);
            let Some(bytes) = self
                .call_new(&self.profiles, PROC_PROFILE_GET, cred, &buf)
                .await?
            else {
                return Ok(None);
            };
            profile::decode_get_res(&bytes).map_err(|source| FetchError::BadReply {
                server: self.client.server(),
                call: "PROFILE_GET",
                source,
            })
        })
    }

    fn forward<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, FetchError>> {
        Box::pin(self.call(PROC_FETCH, cred, args))
    }
}
