//! Attributes for fixtures.

use nfs3_types::nfs3::{fattr3, ftype3, nfstime3, specdata3};

/// Attributes of a regular file of `size` bytes last changed at `mtime`
/// (seconds; access and change times the same), owned by root, file id 1
/// on file system 1.
pub fn file_attrs(size: u64, mtime: u32) -> fattr3 {
    let t = nfstime3 {
        seconds: mtime,
        nseconds: 0,
    };
    fattr3 {
        type_: ftype3::NF3REG,
        mode: 0o644,
        nlink: 1,
        uid: 0,
        gid: 0,
        size,
        used: size,
        rdev: specdata3::default(),
        fsid: 1,
        fileid: 1,
        atime: t,
        mtime: t,
        ctime: t,
    }
}
