//! Working-set profiles kept at the origin, beside the image they order,
//! as `.NAME.gvfsprofile` (the bytes of a kept profile, `profile.rs`): the
//! proxy next to the image server writes the profiles it is sent there,
//! so that they outlive every proxy's restart, reach every site, and
//! `gvfsctl meta show` finds them beside the image.
//!
//! Writing one is best effort, as the caller (CREATE and a FILE_SYNC
//! WRITE; a caller who may not write the directory keeps the profile only
//! in the proxies' indexes). Reading one trusts nothing but its CRC and
//! the version it names: a profile only orders fetches.

use super::*;
use gvfs_ext::profile::{MAX_PROFILE_LEN, Profile, profile_name};

impl MetaLayer {
    fn profile_place(&self, fh: &[u8]) -> Option<(Vec<u8>, String)> {
        let known = self.files().get(fh).and_then(|e| e.name.clone());
        let (dir, name) = known.or_else(|| self.indexed_name(fh))?;
        Some((dir, profile_name(&name)?))
    }

    /// Writes `p` beside the file `fh` at the origin.
    pub async fn write_profile(
        &self,
        cx: &CallContext,
        fh: &[u8],
        p: &Profile,
    ) -> Result<(), String> {
        let (dir, name) = self
            .profile_place(fh)
            .ok_or("the file's name is not known here")?;
        let create = NfsRequest::Create(CREATE3args {
            where_: diropargs3 {
                dir: nfs_fh3 {
                    data: Opaque::owned(dir),
                },
                name: filename3::from(name.clone().into_bytes()),
            },
            how: createhow3::UNCHECKED(sattr3 {
                mode: Nfs3Option::Some(0o644),
                size: Nfs3Option::Some(0),
                ..Default::default()
            }),
        });
        let pfh = match self.inner.call(cx, create).await {
            Ok(NfsReply::Create(Nfs3Result::Ok(ok))) => match ok.obj {
                Nfs3Option::Some(h) => h,
                Nfs3Option::None => return Err("CREATE returned no handle".into()),
            },
            Ok(other) => return Err(format!("CREATE {name}: {:?}", other.status())),
            Err(e) => return Err(format!("CREATE {name}: {e}")),
        };
        let bytes = p.record();
        let write = NfsRequest::Write(WRITE3args {
            file: pfh,
            offset: 0,
            count: bytes.len() as u32,
            stable: stable_how::FILE_SYNC,
            data: Opaque::owned(bytes),
        });
        match self.inner.call(cx, write).await {
            Ok(NfsReply::Write(Nfs3Result::Ok(_))) => Ok(()),
            Ok(other) => Err(format!("WRITE {name}: {:?}", other.status())),
            Err(e) => Err(format!("WRITE {name}: {e}")),
        }
    }

    /// The profile beside the file `fh` at the origin, if there is one for
    /// its version `attrs`.
    pub async fn read_profile(
        &self,
        cx: &CallContext,
        fh: &[u8],
        attrs: &fattr3,
    ) -> Option<Profile> {
        let (dir, name) = self.profile_place(fh)?;
        let lookup = NfsRequest::Lookup(LOOKUP3args {
            what: diropargs3 {
                dir: nfs_fh3 {
                    data: Opaque::owned(dir),
                },
                name: filename3::from(name.into_bytes()),
            },
        });
        let pfh = match self.inner.call(cx, lookup).await {
            Ok(NfsReply::Lookup(Nfs3Result::Ok(ok))) => ok.object,
            _ => return None,
        };
        let read = NfsRequest::Read(READ3args {
            file: pfh,
            offset: 0,
            count: MAX_PROFILE_LEN as u32 + 1,
        });
        let bytes = match self.inner.call(cx, read).await {
            Ok(NfsReply::Read(Nfs3Result::Ok(ok))) if ok.data.len() <= MAX_PROFILE_LEN => ok.data,
            _ => return None,
        };
        Profile::from_record(&bytes).filter(|p| p.version().describes(attrs))
    }
}

/// What the extension server asks of the files beside an image: this
/// layer's own answers, which hold its table of names and metadata.
impl gvfs_filecache::SideFiles for MetaLayer {
    fn meta_of_version<'a>(
        &'a self,
        cx: &'a CallContext,
        fh: &'a [u8],
        attrs: &'a fattr3,
    ) -> gvfs_nfs::BoxFuture<'a, Option<Arc<MetaFile>>> {
        Box::pin(MetaLayer::meta_of_version(self, cx, fh, attrs))
    }

    fn read_profile<'a>(
        &'a self,
        cx: &'a CallContext,
        fh: &'a [u8],
        attrs: &'a fattr3,
    ) -> gvfs_nfs::BoxFuture<'a, Option<Profile>> {
        Box::pin(MetaLayer::read_profile(self, cx, fh, attrs))
    }

    fn write_profile<'a>(
        &'a self,
        cx: &'a CallContext,
        fh: &'a [u8],
        p: &'a Profile,
    ) -> gvfs_nfs::BoxFuture<'a, Result<(), String>> {
        Box::pin(MetaLayer::write_profile(self, cx, fh, p))
    }
}
