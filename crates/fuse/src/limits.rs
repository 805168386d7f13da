//! Bounds of what the front end keeps, shared by its tables and the
//! journal that records them (which must read back nothing larger).

/// Longest name in a directory, as a local file system allows.
pub(crate) const NAME_MAX: usize = 255;
/// Most open files and directories at once.
pub(crate) const MAX_OPEN: usize = 65_536;
/// Most live nodes (about 200 bytes each with a 64-byte handle).
pub(crate) const MAX_NODES: usize = 1 << 20;
/// The root's node id (FUSE's).
pub(crate) const ROOT: u64 = 1;
/// Longest NFSv3 file handle (RFC 1813 `NFS3_FHSIZE`).
pub(crate) const MAX_FH: usize = 64;
