//! Where the file cache gets chunks of whole files from.

use std::sync::Arc;

use gvfs_nfs::nfs3_types::nfs3::fattr3;
use gvfs_nfs::{BoxFuture, Credentials};

use crate::error::FetchError;
use crate::fetch::{FetchArgs, FetchOk};
use crate::gate::Ticket;
use crate::profile::Profile;
use crate::proto::{CHUNK, Class, Tenant};
use crate::store::StoreArgs;

/// What a fetch is for: its priority class, and the tenant it is billed
/// to (whoever started it: a node's LAN proxy, or this proxy itself).
/// Readers' fetches go as [`Class::Demand`], a working-set profile's as
/// [`Class::Profile`], a file's background stream as
/// [`Class::Background`] (or [`Class::Bulk`] behind a sequential reader).
/// With a [`Ticket`], the fetch's calls are admitted under it, so that a
/// reader who comes to wait for the same bytes can raise it while it is
/// still queued; without one, each call gets a ticket of its own.
#[derive(Debug, Clone)]
pub struct Want {
    /// How much it matters.
    pub class: Class,
    /// Whom it is for.
    pub tenant: Tenant,
    /// The ticket its calls go under, shared with those who may raise it.
    pub ticket: Option<Arc<Ticket>>,
}

impl PartialEq for Want {
    fn eq(&self, other: &Self) -> bool {
        (self.class, self.tenant) == (other.class, other.tenant)
    }
}

impl Eq for Want {}

impl Want {
    /// A fetch of `class` for `tenant`.
    pub const fn new(class: Class, tenant: Tenant) -> Self {
        Self {
            class,
            tenant,
            ticket: None,
        }
    }

    /// A fetch of `class` for this proxy itself ([`Tenant::LOCAL`]).
    pub const fn local(class: Class) -> Self {
        Self::new(class, Tenant::LOCAL)
    }

    /// The same tenant's fetch, of `class` (no ticket).
    pub fn with_class(&self, class: Class) -> Self {
        Self::new(class, self.tenant)
    }

    /// The same fetch under a new ticket of its class and tenant, and that
    /// ticket.
    pub fn ticketed(&self) -> (Self, Arc<Ticket>) {
        let ticket = Ticket::new(self.class, self.tenant);
        let want = Self {
            ticket: Some(ticket.clone()),
            ..self.clone()
        };
        (want, ticket)
    }

    /// The ticket its calls go under: its own, else a new one.
    pub fn ticket(&self) -> Arc<Ticket> {
        self.ticket
            .clone()
            .unwrap_or_else(|| Ticket::new(self.class, self.tenant))
    }
}

/// Where chunks of whole files come from: an upstream that speaks this
/// program (or, in tests, anything else).
pub trait ChunkSource: Send + Sync + 'static {
    /// One FETCH, asked with the class `want` names (FETCH_CLASS, or with
    /// an older upstream FETCH_DEMAND when a reader waits for it).
    fn fetch<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a FetchArgs,
        want: &'a Want,
    ) -> BoxFuture<'a, Result<FetchOk, FetchError>>;

    /// Keeps a file's working-set profile upstream (PROFILE_PUT). A source
    /// that keeps none does nothing.
    fn put_profile<'a>(
        &'a self,
        _cred: &'a Credentials,
        _fh: &'a [u8],
        _profile: &'a Profile,
    ) -> BoxFuture<'a, Result<(), FetchError>> {
        Box::pin(async { Ok(()) })
    }

    /// The working-set profile upstream knows for a file (PROFILE_GET).
    fn get_profile<'a>(
        &'a self,
        _cred: &'a Credentials,
        _fh: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<Profile>, FetchError>> {
        Box::pin(async { Ok(None) })
    }

    /// One STORE: a chunk written back; the file's attributes after it.
    /// With `args.guard`, only if the file still has those attributes
    /// (else `FetchError::Nfs(NFS3ERR_NOT_SYNC)`), where the source can
    /// check; one that cannot (an older proxy) stores without the check.
    fn store<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a StoreArgs,
    ) -> BoxFuture<'a, Result<fattr3, FetchError>>;

    /// Whether the source answers FETCH at all (asked once, remembered).
    fn supported(&self) -> BoxFuture<'_, bool>;

    /// The most raw bytes one FETCH of `class` should ask for now: a
    /// whole chunk, unless the source keeps demand's wait short by having
    /// background and bulk chunks asked in parts ([`Gate::part`]).
    ///
    /// [`Gate::part`]: crate::gate::Gate::part
    fn part(&self, _class: Class) -> u32 {
        CHUNK
    }

    /// One FETCH sent on as it came, its XDR results returned as they came:
    /// what a middle proxy without a file cache does.
    fn forward<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, FetchError>>;
}
