//! The extension program spoken to an upstream over its NFS connection.
//!
//! What the upstream speaks is agreed once per connection: HELLO in
//! version 2 names the capabilities ([`Caps`]) both sides speak, and every
//! call on that connection keeps to them. An upstream that answers
//! version 2 with PROG_MISMATCH (a proxy from before version 2) is spoken
//! to in version 1, taken to know every procedure until it refuses one
//! (PROC_UNAVAIL), which is then left out for as long as the agreement
//! lasts. A new connection (the upstream restarted, perhaps as another
//! build) is agreed anew before its first call.
//!
//! A FETCH goes as FETCH_CLASS, carrying its class, when both sides speak
//! it; to an older upstream as FETCH_HAVE (when the caller holds blocks),
//! FETCH_DEMAND (a reader waits), FETCH_REPEATS or, oldest, FETCH: each
//! call one of them, the next tried only after a refusal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gvfs_nfs::net::client::{ClientError, RpcClient};
use gvfs_nfs::nfs3_types::nfs3::{fattr3, nfsstat3};
use gvfs_nfs::rpc::{ReplyError, ReplyStatus};
use gvfs_nfs::xdr::{XdrReader, put_opaque, put_u32};
use gvfs_nfs::{BoxFuture, Credentials};

use crate::error::FetchError;
use crate::fetch::{
    FetchArgs, FetchOk, decode_fetch_repeats_res, decode_fetch_res, encode_class_args,
    encode_have_args,
};
use crate::gate::Gate;
use crate::profile::{self, Profile};
use crate::proto::*;
use crate::source::{ChunkSource, Want};
use crate::store::{StoreArgs, decode_store_res};

/// What was agreed with the upstream on one of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Agreement {
    /// The connection it holds for (the RPC client's `connects` when it
    /// was made).
    connection: u64,
    /// The version calls are made in.
    version: u32,
    /// What both sides speak (less what the upstream refused since).
    caps: Caps,
}

/// What is known of the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Not asked yet, or no answer came.
    Unknown,
    /// It does not speak the program: remembered for good.
    Silent,
    /// What was agreed (perhaps on an earlier connection).
    Agreed(Agreement),
}

/// The extension program spoken to an upstream over its NFS connection.
pub struct ExtClient {
    client: RpcClient,
    /// What is known of the upstream; read on every call.
    known: Mutex<Known>,
    /// Held while a HELLO is under way: callers that come meanwhile wait
    /// for its answer instead of asking again.
    agreeing: tokio::sync::Mutex<()>,
    /// Longest wait for HELLO's answer ([`PROBE_TIMEOUT`]).
    probe_timeout: Duration,
    /// Whether the warning that write-backs go unguarded was given.
    warned_unguarded: AtomicBool,
    /// Orders fetches to the upstream by class and tenant, over the link
    /// `client` measures.
    gate: Gate,
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
    /// `probe_timeout` for the upstream to say what it speaks.
    pub(crate) fn with_probe_timeout(client: RpcClient, probe_timeout: Duration) -> Self {
        Self {
            gate: Gate::new(client.link()),
            client,
            known: Mutex::new(Known::Unknown),
            agreeing: tokio::sync::Mutex::new(()),
            probe_timeout,
            warned_unguarded: AtomicBool::new(false),
        }
    }

    /// The gate fetches to the upstream pass ([`Gate`]).
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The version and capabilities agreed with the upstream, if it speaks
    /// the program: what is known for the current connection, or else a
    /// HELLO first. `Err` when the upstream did not answer (ask again next
    /// time).
    async fn agreed(&self) -> Result<Option<Agreement>, ()> {
        if let Some(known) = self.current() {
            return Ok(known);
        }
        let _one_at_a_time = self.agreeing.lock().await;
        if let Some(known) = self.current() {
            return Ok(known);
        }
        let found = self.hello().await?;
        *lock(&self.known) = match found {
            Some(a) => Known::Agreed(a),
            None => Known::Silent,
        };
        Ok(found)
    }

    /// What is known and still holds: `Some(None)` when the upstream does
    /// not speak the program, `Some(agreement)` for this connection, `None`
    /// when it must be asked.
    fn current(&self) -> Option<Option<Agreement>> {
        match *lock(&self.known) {
            Known::Silent => Some(None),
            Known::Agreed(a) if a.connection == self.connection() => Some(Some(a)),
            _ => None,
        }
    }

    /// The agreement calls are made under: this connection's, or when the
    /// upstream did not answer HELLO, the last one (version 1 and every
    /// capability before any).
    async fn terms(&self) -> Agreement {
        match self.agreed().await {
            Ok(Some(a)) => a,
            _ => match *lock(&self.known) {
                Known::Agreed(a) => a,
                _ => Agreement {
                    connection: 0,
                    version: VERSION_1,
                    caps: Caps::VERSION_1,
                },
            },
        }
    }

    /// Connections the RPC client has opened: a new one is agreed anew.
    fn connection(&self) -> u64 {
        self.client.stats().connects.get()
    }

    /// Sends HELLO naming every capability: `Ok` with the agreement, or
    /// `None` when the upstream does not speak the program; `Err` when no
    /// answer came.
    async fn hello(&self) -> Result<Option<Agreement>, ()> {
        let cred = Credentials::default();
        let mut args = Vec::with_capacity(4);
        put_u32(&mut args, Caps::ALL.0);
        let call = self.client.call(PROGRAM, VERSION, PROC_HELLO, &cred, &args);
        let answer = tokio::time::timeout(self.probe_timeout, call).await;
        let agreement = |version, caps| Agreement {
            connection: self.connection(),
            version,
            caps,
        };
        match answer {
            Ok(Ok(reply)) => {
                let mut r = XdrReader::new(&reply);
                match r.u32().and_then(|caps| r.end().map(|()| caps)) {
                    Ok(caps) => Ok(Some(agreement(VERSION, Caps(caps).and(Caps::ALL)))),
                    Err(e) => {
                        tracing::warn!(
                            server = %self.client.server(),
                            error = %e,
                            "upstream's HELLO answer does not decode; \
                             compress-and-copy files are read block by block"
                        );
                        Ok(None)
                    }
                }
            }
            Ok(Err(ClientError::Rpc {
                error: ReplyError::Accepted(ReplyStatus::ProgMismatch { low, high }),
                ..
            })) if (low..=high).contains(&VERSION_1) => {
                tracing::info!(
                    server = %self.client.server(),
                    "upstream speaks version 1 of the gvfs extension (an older gvfs-proxy)"
                );
                Ok(Some(agreement(VERSION_1, Caps::VERSION_1)))
            }
            Ok(Err(ClientError::Rpc {
                error: ReplyError::Accepted(ReplyStatus::ProcUnavail),
                ..
            })) => {
                // It runs the program in version 2 but not HELLO: learn
                // what it knows one refusal at a time, as in version 1.
                Ok(Some(agreement(VERSION, Caps::VERSION_1)))
            }
            Ok(Err(ClientError::Rpc { error, .. })) => {
                tracing::info!(
                    server = %self.client.server(),
                    "upstream does not speak the gvfs extension ({error}); \
                     compress-and-copy files are read block by block"
                );
                Ok(None)
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "extension HELLO got no answer");
                Err(())
            }
            Err(_) => {
                tracing::debug!(after = ?self.probe_timeout, "extension HELLO got no answer");
                Err(())
            }
        }
    }

    /// Calls `proc_` if `terms` include `cap`; on PROC_UNAVAIL leaves
    /// `cap` out of the agreement and answers `Ok(None)`.
    async fn call_if(
        &self,
        terms: Agreement,
        cap: Caps,
        proc_: u32,
        cred: &Credentials,
        args: &[u8],
    ) -> Result<Option<Vec<u8>>, FetchError> {
        if !terms.caps.has(cap) {
            return Ok(None);
        }
        match self
            .client
            .call(PROGRAM, terms.version, proc_, cred, args)
            .await
        {
            Ok(reply) => Ok(Some(reply.to_vec())),
            Err(ClientError::Rpc {
                error: ReplyError::Accepted(ReplyStatus::ProcUnavail),
                ..
            }) => {
                self.refused(proc_, cap);
                Ok(None)
            }
            Err(e) => Err(FetchError::Transport(e)),
        }
    }

    /// The upstream refused `proc_` (PROC_UNAVAIL): `cap` is left out of
    /// the agreement for as long as it lasts.
    fn refused(&self, proc_: u32, cap: Caps) {
        tracing::info!(
            server = %self.client.server(),
            proc_,
            "upstream does not know this extension procedure (an older gvfs-proxy)"
        );
        if let Known::Agreed(a) = &mut *lock(&self.known) {
            a.caps = a.caps.without(cap);
        }
    }

    async fn call(
        &self,
        terms: Agreement,
        proc_: u32,
        cred: &Credentials,
        args: &[u8],
    ) -> Result<Vec<u8>, FetchError> {
        match self
            .client
            .call(PROGRAM, terms.version, proc_, cred, args)
            .await
        {
            Ok(reply) => Ok(reply.to_vec()),
            Err(e) => Err(FetchError::Transport(e)),
        }
    }
}

impl ExtClient {
    /// One FETCH: each round one call, in the procedure the terms allow
    /// ([`fetch_call`]); one the upstream refuses is left out and the next
    /// round asks with the next. Every FETCH of this proxy's file cache
    /// goes through here, one wire call at a time, so that whatever orders
    /// them by class sits at one place: the [`Gate`], which admits each
    /// call by its class and tenant (under the [`Want`]'s ticket, which a
    /// waiter may raise while it is queued) before `send` and learns the
    /// wire bytes of its reply. (A version-1 peer's FETCH passed on whole
    /// by a proxy without a file cache, `forward`, does not pass it.)
    async fn fetch_chunk(
        &self,
        cred: &Credentials,
        args: &FetchArgs,
        want: &Want,
    ) -> Result<FetchOk, FetchError> {
        let mut terms = self.terms().await;
        let ticket = want.ticket();
        let (proc_, bytes) = loop {
            let permit = self.gate.admit(&ticket, args.count).await;
            let (cap, proc_, buf) = fetch_call(terms.caps, args, ticket.class());
            let send = self.client.call(PROGRAM, terms.version, proc_, cred, &buf);
            match send.await {
                Ok(reply) => {
                    permit.done(reply.len() as u64);
                    break (proc_, reply.to_vec());
                }
                Err(ClientError::Rpc {
                    error: ReplyError::Accepted(ReplyStatus::ProcUnavail),
                    ..
                }) if cap != Caps(0) => {
                    self.refused(proc_, cap);
                    terms.caps = terms.caps.without(cap);
                }
                Err(e) => return Err(FetchError::Transport(e)),
            }
        };
        let decoded = if proc_ == PROC_FETCH {
            decode_fetch_res(&bytes)
        } else {
            decode_fetch_repeats_res(&bytes)
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
    }
}

/// The procedure a FETCH of `class` goes as under `caps`, the capability
/// it needs (none for FETCH, which every peer speaks) and its arguments:
/// FETCH_CLASS; else (an older peer) FETCH_HAVE when the caller holds
/// blocks, FETCH_DEMAND when a reader waits, FETCH_REPEATS; else FETCH.
fn fetch_call(caps: Caps, args: &FetchArgs, class: Class) -> (Caps, u32, Vec<u8>) {
    let mut buf = Vec::with_capacity(args.fh.len() + 64);
    let have = args.have.as_ref().filter(|h| !h.is_empty());
    if caps.has(Caps::CLASS) {
        encode_class_args(&mut buf, args, class);
        return (Caps::CLASS, PROC_FETCH_CLASS, buf);
    }
    if !caps.has(Caps::REPEATS) {
        args.encode(&mut buf);
        return (Caps(0), PROC_FETCH, buf);
    }
    let demand = class == Class::Demand;
    match have {
        Some(have) if caps.has(Caps::HAVE) => {
            encode_have_args(&mut buf, args, have, demand);
            (Caps::HAVE, PROC_FETCH_HAVE, buf)
        }
        _ => {
            args.encode(&mut buf);
            if demand && caps.has(Caps::DEMAND) {
                (Caps::DEMAND, PROC_FETCH_DEMAND, buf)
            } else {
                (Caps::REPEATS, PROC_FETCH_REPEATS, buf)
            }
        }
    }
}

/// Locks `m`, a poisoned lock included (its data stays consistent: every
/// section only assigns).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ChunkSource for ExtClient {
    fn fetch<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a FetchArgs,
        want: &'a Want,
    ) -> BoxFuture<'a, Result<FetchOk, FetchError>> {
        Box::pin(self.fetch_chunk(cred, args, want))
    }

    fn store<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a StoreArgs,
    ) -> BoxFuture<'a, Result<fattr3, FetchError>> {
        Box::pin(async move {
            let terms = self.terms().await;
            let mut buf = Vec::with_capacity(args.fh.len() + args.data.len() + 56);
            args.encode(&mut buf);
            let guarded = match args.guard {
                Some(_) => {
                    self.call_if(terms, Caps::GUARDED, PROC_STORE_GUARDED, cred, &buf)
                        .await?
                }
                None => None,
            };
            let bytes = match guarded {
                Some(bytes) => bytes,
                None => {
                    if args.guard.is_some() {
                        if !self.warned_unguarded.swap(true, Ordering::Relaxed) {
                            tracing::warn!(
                                server = %self.client.server(),
                                "upstream does not know STORE_GUARDED (an older gvfs-proxy): \
                                 write-backs of whole files cannot check that the origin is \
                                 unchanged and may overwrite changes made there"
                            );
                        }
                        // STORE's arguments: without the guard at the end.
                        buf.truncate(buf.len() - GUARD_LEN);
                    }
                    self.call(terms, PROC_STORE, cred, &buf).await?
                }
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

    fn part(&self, class: Class) -> u32 {
        if class <= Class::Background {
            self.gate.part()
        } else {
            CHUNK
        }
    }

    fn supported(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move { matches!(self.agreed().await, Ok(Some(_))) })
    }

    fn put_profile<'a>(
        &'a self,
        cred: &'a Credentials,
        fh: &'a [u8],
        profile: &'a Profile,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        Box::pin(async move {
            let terms = self.terms().await;
            let mut buf = Vec::new();
            profile::encode_put(&mut buf, fh, profile);
            let Some(bytes) = self
                .call_if(terms, Caps::PROFILES, PROC_PROFILE_PUT, cred, &buf)
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
            let terms = self.terms().await;
            let mut buf = Vec::new();
            put_opaque(&mut buf, fh);
            let Some(bytes) = self
                .call_if(terms, Caps::PROFILES, PROC_PROFILE_GET, cred, &buf)
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
        Box::pin(async move {
            let terms = self.terms().await;
            self.call(terms, PROC_FETCH, cred, args).await
        })
    }
}
