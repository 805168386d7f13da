//! File names from the wire: one path component, never a path.
//!
//! A name with a '/' or a NUL in it, or an empty one, could reach outside
//! the directory it is looked up in; it is refused with `ACCES`, as Linux's
//! `lookup_one_len` refuses it for knfsd. "." and ".." are resolved by the
//! procedures themselves, never by the filesystem.

use nfs3_types::nfs3::nfsstat3;

use super::status::Fail;

/// Longest file name accepted (NAME_MAX).
pub(super) const MAX_NAME: usize = 255;

/// Longest symbolic link target accepted (PATH_MAX).
pub(super) const MAX_TARGET: usize = 4096;

/// A checked file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Name<'a> {
    /// "."
    Dot,
    /// ".."
    DotDot,
    /// Any other single path component.
    Entry(&'a [u8]),
}

/// Checks a name from a request.
pub(super) fn parse(name: &[u8]) -> Result<Name<'_>, Fail> {
    if name.len() > MAX_NAME {
        return Err(Fail(nfsstat3::NFS3ERR_NAMETOOLONG));
    }
    if name.is_empty() || name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(Fail(nfsstat3::NFS3ERR_ACCES));
    }
    Ok(match name {
        b"." => Name::Dot,
        b".." => Name::DotDot,
        n => Name::Entry(n),
    })
}

/// Checks a name that must be an ordinary entry; "." and ".." fail with
/// `on_dot` (EXIST to creating them, as knfsd and nfs-ganesha answer; INVAL
/// to renaming them, as RFC 1813 section 3.3.14 suggests).
pub(super) fn entry(name: &[u8], on_dot: nfsstat3) -> Result<&[u8], Fail> {
    match parse(name)? {
        Name::Entry(n) => Ok(n),
        Name::Dot | Name::DotDot => Err(Fail(on_dot)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_be_paths() {
        for bad in [&b""[..], b"a/b", b"/", b"../x", b"a\0b"] {
            assert_eq!(parse(bad), Err(Fail(nfsstat3::NFS3ERR_ACCES)), "{bad:?}");
        }
        assert_eq!(
            parse(&[b'a'; 256]),
            Err(Fail(nfsstat3::NFS3ERR_NAMETOOLONG))
        );
        assert_eq!(parse(&[b'a'; 255]), Ok(Name::Entry(&[b'a'; 255])));
        assert_eq!(parse(b".."), Ok(Name::DotDot));
        assert_eq!(parse(b"..."), Ok(Name::Entry(b"...")));
        assert_eq!(
            entry(b".", nfsstat3::NFS3ERR_EXIST),
            Err(Fail(nfsstat3::NFS3ERR_EXIST))
        );
    }
}
