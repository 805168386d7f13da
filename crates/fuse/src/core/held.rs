//! What the core holds of each open file or directory and each file
//! hidden while open.

use gvfs_nfs::CallContext;

use crate::inodes::Handle;

use super::listing::Listing;

/// An open file or directory.
#[derive(Debug)]
pub(crate) struct Open {
    pub(crate) ino: u64,
    /// The opener's credentials: reads and writes through the file are
    /// sent with them, as the kernel NFS client does (so the kernel's own
    /// write-back of mapped pages is written as the opener).
    pub(crate) cx: CallContext,
    /// A directory's cookie verifier, from its last READDIRPLUS.
    pub(crate) verf: [u8; 8],
    /// The part of a directory's last READDIRPLUS the kernel did not take
    /// yet (its reply buffer was full): the next page, without a call.
    pub(crate) listing: Option<Listing>,
}

/// A file removed while it was open: renamed to a hidden name instead,
/// and removed at its last close (the NFS client's "silly rename").
#[derive(Debug)]
pub(crate) struct Hidden {
    pub(crate) dir: Handle,
    pub(crate) name: Vec<u8>,
    pub(crate) cx: CallContext,
}
