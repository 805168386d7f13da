//! [`SideFiles`]: what is kept beside an image at the origin, as the
//! answering side of the extension program asks for it.
//!
//! Beside each image the origin may keep its metadata file
//! (`.NAME.gvfsmeta`: zero map, repeats, fingerprints) and a working-set
//! profile (`.NAME.gvfsprofile`). Finding them takes the image's name and
//! directory, which only the metadata layer learns (from LOOKUP and
//! READDIRPLUS replies, and its index after a restart), and reading the
//! metadata file is done once per file version under that layer's lock
//! and counted in its counters. So the file cache does not read them
//! itself: it names this small trait, the metadata layer implements it,
//! and the stack gives it to whoever serves the file cache's files to
//! other proxies. One owner keeps the table of names and metadata; the
//! server sees three questions, not the layer.

use std::sync::Arc;

use gvfs_ext::profile::Profile;
use gvfs_metafile::MetaFile;
use gvfs_nfs::nfs3_types::nfs3::fattr3;
use gvfs_nfs::{BoxFuture, CallContext};

/// The files kept beside images at the origin, found through the layers
/// below the one that implements this.
pub trait SideFiles: Send + Sync {
    /// The metadata of `fh` when it is valid for this version of the file
    /// (`attrs`, fresh from upstream), looking for it on first use.
    fn meta_of_version<'a>(
        &'a self,
        cx: &'a CallContext,
        fh: &'a [u8],
        attrs: &'a fattr3,
    ) -> BoxFuture<'a, Option<Arc<MetaFile>>>;

    /// The working-set profile kept beside `fh`, if there is one for its
    /// version `attrs`.
    fn read_profile<'a>(
        &'a self,
        cx: &'a CallContext,
        fh: &'a [u8],
        attrs: &'a fattr3,
    ) -> BoxFuture<'a, Option<Profile>>;

    /// Writes `p` beside `fh` (best effort: the reason when it was not).
    fn write_profile<'a>(
        &'a self,
        cx: &'a CallContext,
        fh: &'a [u8],
        p: &'a Profile,
    ) -> BoxFuture<'a, Result<(), String>>;
}
