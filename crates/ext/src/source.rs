//! Where the file cache gets chunks of whole files from.

use gvfs_nfs::nfs3_types::nfs3::fattr3;
use gvfs_nfs::{BoxFuture, Credentials};

use crate::error::FetchError;
use crate::fetch::{FetchArgs, FetchOk};
use crate::profile::Profile;
use crate::proto::Class;
use crate::store::StoreArgs;

/// Where chunks of whole files come from: an upstream that speaks this
/// program (or, in tests, anything else).
pub trait ChunkSource: Send + Sync + 'static {
    /// One FETCH, asked with FETCH_DEMAND when a reader waits for it.
    fn fetch<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a FetchArgs,
        urgency: Class,
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

    /// One FETCH sent on as it came, its XDR results returned as they came:
    /// what a middle proxy without a file cache does.
    fn forward<'a>(
        &'a self,
        cred: &'a Credentials,
        args: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, FetchError>>;
}
