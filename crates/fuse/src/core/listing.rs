//! What a directory listing holds: its entries as the kernel gets them, and
//! the part of one kept for the kernel's next READDIR.

use fuser::FileType;
use nfs3_types::nfs3::fattr3;

use crate::inodes::Handle;

/// One directory entry as the kernel gets it.
#[derive(Debug)]
pub(crate) struct Listed {
    /// The inode number listed (what `stat` shows for it).
    pub(crate) ino: u64,
    /// The offset of the entry after it (the server's cookie).
    pub(crate) next: u64,
    pub(crate) kind: FileType,
    pub(crate) name: Vec<u8>,
    /// Its handle and attributes, for READDIRPLUS.
    pub(crate) plus: Option<(Handle, fattr3)>,
}

impl Listed {
    /// `.` or `..`: listed, never handed to the kernel as an entry.
    pub(crate) fn is_dot(&self) -> bool {
        self.name == b"." || self.name == b".."
    }
}

/// Entries of a listing kept for the kernel's next READDIR.
#[derive(Debug)]
pub(crate) struct Listing {
    /// The offset they continue from.
    pub(super) from: u64,
    pub(super) entries: Vec<Listed>,
    /// The server said these end the directory.
    pub(super) eof: bool,
    pub(super) bytes: u64,
}
