//! The 22 procedures of NFS version 3 (RFC 1813 section 3.3) as typed
//! requests and replies, with their XDR codecs.
//!
//! Requests and replies own their data (`'static` lifetimes) so they can
//! cross task boundaries and sit in caches. File handles are carried as the
//! opaque bytes the upstream issued; nothing here interprets them.

use std::borrow::Cow;

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Void;

use crate::xdr::{XdrError, decode_exact, encode_into};

/// NFS program number (RFC 1813).
pub const NFS_PROGRAM: u32 = 100_003;
/// MOUNT program number (RFC 1813, appendix I).
pub const MOUNT_PROGRAM: u32 = 100_005;

/// MOUNT procedure numbers (RFC 1813, appendix I).
pub mod mount_procs {
    /// NULL.
    pub const NULL: u32 = 0;
    /// MNT: the root handle of an export path.
    pub const MNT: u32 = 1;
    /// DUMP: the mount list.
    pub const DUMP: u32 = 2;
    /// UMNT.
    pub const UMNT: u32 = 3;
    /// UMNTALL.
    pub const UMNTALL: u32 = 4;
    /// EXPORT: the export list.
    pub const EXPORT: u32 = 5;
}

/// A call as logs name it, from its program and procedure numbers: the
/// NFSv3 or MOUNT procedure's name, else `program/procedure`.
#[derive(Debug, Clone, Copy)]
pub struct CallName(pub u32, pub u32);

impl std::fmt::Display for CallName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MOUNT: [&str; 6] = ["MOUNT NULL", "MNT", "DUMP", "UMNT", "UMNTALL", "EXPORT"];
        match (self.0, NfsProc::from_u32(self.1)) {
            (NFS_PROGRAM, Some(p)) => f.write_str(p.name()),
            (MOUNT_PROGRAM, _) if (self.1 as usize) < MOUNT.len() => {
                f.write_str(MOUNT[self.1 as usize])
            }
            (prog, _) => write!(f, "{prog}/{}", self.1),
        }
    }
}

/// Longest file handle NFSv3 allows (RFC 1813 section 2.3.3).
pub const MAX_FH_LEN: usize = NFS3_FHSIZE;

/// The most READ or WRITE payload (and READDIR reply) gvfs moves in one
/// call. Proxies advertise at most this in FSINFO, whatever the upstream
/// allows, and size their record caps from it.
pub const MAX_DATA: u32 = 1 << 20;

/// A reply with the given error status and empty (absent) attributes, for
/// answering any procedure when the layer below could not.
trait EmptyFailure {
    fn empty() -> Self;
}

macro_rules! empty_failure {
    ($($t:ty),* $(,)?) => { $(impl EmptyFailure for $t { fn empty() -> Self { Self::default() } })* };
}

empty_failure!(
    Void,
    ACCESS3resfail,
    CREATE3resfail,
    FSINFO3resfail,
    FSSTAT3resfail,
    LOOKUP3resfail,
    MKDIR3resfail,
    PATHCONF3resfail,
    READ3resfail,
    READDIR3resfail,
    READDIRPLUS3resfail,
    READLINK3resfail,
    REMOVE3resfail,
    RENAME3resfail,
    SETATTR3resfail,
    SYMLINK3resfail,
    WRITE3resfail,
);

impl EmptyFailure for COMMIT3resfail {
    fn empty() -> Self {
        Self {
            file_wcc: wcc_data::default(),
        }
    }
}
impl EmptyFailure for LINK3resfail {
    fn empty() -> Self {
        Self {
            file_attributes: post_op_attr::None,
            linkdir_wcc: wcc_data::default(),
        }
    }
}
impl EmptyFailure for MKNOD3resfail {
    fn empty() -> Self {
        Self {
            dir_wcc: wcc_data::default(),
        }
    }
}
impl EmptyFailure for RMDIR3resfail {
    fn empty() -> Self {
        Self {
            dir_wcc: wcc_data::default(),
        }
    }
}

/// Why call arguments or reply results could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Procedure number outside 0..=21.
    #[error("no NFSv3 procedure {0}")]
    UnknownProcedure(u32),
    /// The bytes are not valid XDR for the procedure.
    #[error("malformed arguments or results: {0}")]
    Garbage(#[from] XdrError),
    /// A file handle longer than 64 bytes.
    #[error("file handle of {0} bytes exceeds 64")]
    HandleTooLong(usize),
}

macro_rules! nfs_procedures {
    ($( $num:literal $variant:ident $name:literal ($args:ty, $res:ty) ),* $(,)?) => {
        /// An NFSv3 procedure number.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum NfsProc { $(
            #[doc = concat!("NFSPROC3_", $name)]
            $variant = $num,
        )* }

        impl NfsProc {
            /// Every procedure, in number order.
            pub const ALL: [NfsProc; 22] = [$(NfsProc::$variant),*];

            /// The procedure with number `n`.
            pub fn from_u32(n: u32) -> Option<Self> {
                match n { $($num => Some(Self::$variant),)* _ => None }
            }

            /// The procedure's name as RFC 1813 spells it.
            pub fn name(self) -> &'static str {
                match self { $(Self::$variant => $name,)* }
            }
        }

        /// The arguments of one NFSv3 call.
        #[derive(Debug)]
        #[allow(missing_docs)]
        pub enum NfsRequest { $( $variant($args), )* }

        /// The results of one NFSv3 call.
        #[derive(Debug)]
        #[allow(missing_docs)]
        pub enum NfsReply { $( $variant($res), )* }

        impl NfsRequest {
            /// Which procedure this calls.
            pub fn proc_(&self) -> NfsProc {
                match self { $(Self::$variant(_) => NfsProc::$variant,)* }
            }

            /// Decodes the arguments of procedure `proc_num`.
            pub fn decode(proc_num: u32, bytes: &[u8]) -> Result<Self, DecodeError> {
                let p = NfsProc::from_u32(proc_num).ok_or(DecodeError::UnknownProcedure(proc_num))?;
                let req = match p { $(NfsProc::$variant => Self::$variant(decode_exact(bytes)?),)* };
                req.check_handles()?;
                Ok(req)
            }

            /// Appends the XDR arguments to `out`.
            pub fn encode(&self, out: &mut Vec<u8>) {
                match self { $(Self::$variant(a) => encode_into(out, a),)* }
            }
        }

        impl NfsReply {
            /// Which procedure this answers.
            pub fn proc_(&self) -> NfsProc {
                match self { $(Self::$variant(_) => NfsProc::$variant,)* }
            }

            /// Decodes the results of procedure `p`. A handle longer than
            /// NFSv3 allows is refused here, as in a call: replies are kept
            /// (duplicate-request and attribute caches) at a size that
            /// assumes it.
            pub fn decode(p: NfsProc, bytes: &[u8]) -> Result<Self, DecodeError> {
                let reply = match p { $(NfsProc::$variant => Self::$variant(decode_exact(bytes)?),)* };
                reply.check_handles()?;
                Ok(reply)
            }

            /// Appends the XDR results to `out`.
            pub fn encode(&self, out: &mut Vec<u8>) {
                match self { $(Self::$variant(r) => encode_into(out, r),)* }
            }

            /// [`encode`](Self::encode), except that the data of a
            /// successful READ is not copied into `out` but moved out and
            /// returned (empty for every other reply): on the wire it follows
            /// `out`, then zero padding to a multiple of 4. `data` is the
            /// last field of `READ3resok` (RFC 1813 section 3.3.6; opaque
            /// padding, RFC 4506 section 4.10).
            pub fn encode_split(self, out: &mut Vec<u8>) -> Cow<'static, [u8]> {
                match self {
                    Self::Read(Nfs3Result::Ok(ok)) => {
                        let data = ok.data.0;
                        encode_into(out, &nfsstat3::NFS3_OK);
                        encode_into(out, &ok.file_attributes);
                        encode_into(out, &ok.count);
                        encode_into(out, &ok.eof);
                        encode_into(out, &u32::try_from(data.len()).unwrap_or(u32::MAX));
                        data
                    }
                    other => {
                        other.encode(out);
                        Cow::Borrowed(&[])
                    }
                }
            }

            /// A reply to `p` carrying `status` and no attributes. NULL has
            /// no status; its "error" is its ordinary empty reply.
            pub fn error(p: NfsProc, status: nfsstat3) -> Self {
                error_reply(p, status)
            }
        }
    };
}

nfs_procedures! {
    0 Null "NULL" (Void, Void),
    1 Getattr "GETATTR" (GETATTR3args, GETATTR3res),
    2 Setattr "SETATTR" (SETATTR3args, SETATTR3res),
    3 Lookup "LOOKUP" (LOOKUP3args<'static>, LOOKUP3res),
    4 Access "ACCESS" (ACCESS3args, ACCESS3res),
    5 Readlink "READLINK" (READLINK3args, READLINK3res<'static>),
    6 Read "READ" (READ3args, READ3res<'static>),
    7 Write "WRITE" (WRITE3args<'static>, WRITE3res),
    8 Create "CREATE" (CREATE3args<'static>, CREATE3res),
    9 Mkdir "MKDIR" (MKDIR3args<'static>, MKDIR3res),
    10 Symlink "SYMLINK" (SYMLINK3args<'static>, SYMLINK3res),
    11 Mknod "MKNOD" (MKNOD3args<'static>, MKNOD3res),
    12 Remove "REMOVE" (REMOVE3args<'static>, REMOVE3res),
    13 Rmdir "RMDIR" (RMDIR3args<'static>, RMDIR3res),
    14 Rename "RENAME" (RENAME3args<'static, 'static>, RENAME3res),
    15 Link "LINK" (LINK3args<'static>, LINK3res),
    16 Readdir "READDIR" (READDIR3args, READDIR3res<'static>),
    17 Readdirplus "READDIRPLUS" (READDIRPLUS3args, READDIRPLUS3res<'static>),
    18 Fsstat "FSSTAT" (FSSTAT3args, FSSTAT3res),
    19 Fsinfo "FSINFO" (FSINFO3args, FSINFO3res),
    20 Pathconf "PATHCONF" (PATHCONF3args, PATHCONF3res),
    21 Commit "COMMIT" (COMMIT3args, COMMIT3res),
}

fn error_reply(p: NfsProc, status: nfsstat3) -> NfsReply {
    fn e<T, E: EmptyFailure>(status: nfsstat3) -> Nfs3Result<T, E> {
        Nfs3Result::Err((status, E::empty()))
    }
    match p {
        NfsProc::Null => NfsReply::Null(Void),
        NfsProc::Getattr => NfsReply::Getattr(e(status)),
        NfsProc::Setattr => NfsReply::Setattr(e(status)),
        NfsProc::Lookup => NfsReply::Lookup(e(status)),
        NfsProc::Access => NfsReply::Access(e(status)),
        NfsProc::Readlink => NfsReply::Readlink(e(status)),
        NfsProc::Read => NfsReply::Read(e(status)),
        NfsProc::Write => NfsReply::Write(e(status)),
        NfsProc::Create => NfsReply::Create(e(status)),
        NfsProc::Mkdir => NfsReply::Mkdir(e(status)),
        NfsProc::Symlink => NfsReply::Symlink(e(status)),
        NfsProc::Mknod => NfsReply::Mknod(e(status)),
        NfsProc::Remove => NfsReply::Remove(e(status)),
        NfsProc::Rmdir => NfsReply::Rmdir(e(status)),
        NfsProc::Rename => NfsReply::Rename(e(status)),
        NfsProc::Link => NfsReply::Link(e(status)),
        NfsProc::Readdir => NfsReply::Readdir(e(status)),
        NfsProc::Readdirplus => NfsReply::Readdirplus(e(status)),
        NfsProc::Fsstat => NfsReply::Fsstat(e(status)),
        NfsProc::Fsinfo => NfsReply::Fsinfo(e(status)),
        NfsProc::Pathconf => NfsReply::Pathconf(e(status)),
        NfsProc::Commit => NfsReply::Commit(e(status)),
    }
}

impl NfsRequest {
    /// True for procedures whose repetition changes the outcome, whose
    /// retransmissions the duplicate-request cache must answer from memory.
    pub fn is_non_idempotent(&self) -> bool {
        self.proc_().is_non_idempotent()
    }
}

impl NfsProc {
    /// True for procedures whose repetition changes the outcome, whose
    /// retransmissions the duplicate-request cache must answer from memory.
    pub fn is_non_idempotent(self) -> bool {
        matches!(
            self,
            NfsProc::Setattr
                | NfsProc::Write
                | NfsProc::Create
                | NfsProc::Mkdir
                | NfsProc::Symlink
                | NfsProc::Mknod
                | NfsProc::Remove
                | NfsProc::Rmdir
                | NfsProc::Rename
                | NfsProc::Link
        )
    }
}

impl NfsRequest {
    /// The file handles this call names.
    pub fn handles(&self) -> Vec<&nfs_fh3> {
        match self {
            Self::Null(_) => vec![],
            Self::Getattr(a) => vec![&a.object],
            Self::Setattr(a) => vec![&a.object],
            Self::Lookup(a) => vec![&a.what.dir],
            Self::Access(a) => vec![&a.object],
            Self::Readlink(a) => vec![&a.symlink],
            Self::Read(a) => vec![&a.file],
            Self::Write(a) => vec![&a.file],
            Self::Create(a) => vec![&a.where_.dir],
            Self::Mkdir(a) => vec![&a.where_.dir],
            Self::Symlink(a) => vec![&a.where_.dir],
            Self::Mknod(a) => vec![&a.where_.dir],
            Self::Remove(a) => vec![&a.object.dir],
            Self::Rmdir(a) => vec![&a.object.dir],
            Self::Rename(a) => vec![&a.from.dir, &a.to.dir],
            Self::Link(a) => vec![&a.file, &a.link.dir],
            Self::Readdir(a) => vec![&a.dir],
            Self::Readdirplus(a) => vec![&a.dir],
            Self::Fsstat(a) => vec![&a.fsroot],
            Self::Fsinfo(a) => vec![&a.fsroot],
            Self::Pathconf(a) => vec![&a.object],
            Self::Commit(a) => vec![&a.file],
        }
    }

    fn check_handles(&self) -> Result<(), DecodeError> {
        for fh in self.handles() {
            if fh.data.len() > MAX_FH_LEN {
                return Err(DecodeError::HandleTooLong(fh.data.len()));
            }
        }
        Ok(())
    }
}

impl NfsReply {
    /// The handles a successful reply gives the client.
    fn handles(&self) -> Vec<&nfs_fh3> {
        fn made(h: &Nfs3Option<nfs_fh3>) -> Option<&nfs_fh3> {
            match h {
                Nfs3Option::Some(fh) => Some(fh),
                Nfs3Option::None => None,
            }
        }
        match self {
            Self::Lookup(Nfs3Result::Ok(ok)) => vec![&ok.object],
            Self::Create(Nfs3Result::Ok(ok)) => made(&ok.obj).into_iter().collect(),
            Self::Mkdir(Nfs3Result::Ok(ok)) => made(&ok.obj).into_iter().collect(),
            Self::Symlink(Nfs3Result::Ok(ok)) => made(&ok.obj).into_iter().collect(),
            Self::Mknod(Nfs3Result::Ok(ok)) => made(&ok.obj).into_iter().collect(),
            Self::Readdirplus(Nfs3Result::Ok(ok)) => ok
                .reply
                .entries
                .0
                .iter()
                .filter_map(|e| made(&e.name_handle))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn check_handles(&self) -> Result<(), DecodeError> {
        for fh in self.handles() {
            if fh.data.len() > MAX_FH_LEN {
                return Err(DecodeError::HandleTooLong(fh.data.len()));
            }
        }
        Ok(())
    }

    /// The status of the reply (`NFS3_OK` for NULL).
    pub fn status(&self) -> nfsstat3 {
        macro_rules! st {
            ($r:expr) => {
                match $r {
                    Nfs3Result::Ok(_) => nfsstat3::NFS3_OK,
                    Nfs3Result::Err((s, _)) => *s,
                }
            };
        }
        match self {
            Self::Null(_) => nfsstat3::NFS3_OK,
            Self::Getattr(r) => st!(r),
            Self::Setattr(r) => st!(r),
            Self::Lookup(r) => st!(r),
            Self::Access(r) => st!(r),
            Self::Readlink(r) => st!(r),
            Self::Read(r) => st!(r),
            Self::Write(r) => st!(r),
            Self::Create(r) => st!(r),
            Self::Mkdir(r) => st!(r),
            Self::Symlink(r) => st!(r),
            Self::Mknod(r) => st!(r),
            Self::Remove(r) => st!(r),
            Self::Rmdir(r) => st!(r),
            Self::Rename(r) => st!(r),
            Self::Link(r) => st!(r),
            Self::Readdir(r) => st!(r),
            Self::Readdirplus(r) => st!(r),
            Self::Fsstat(r) => st!(r),
            Self::Fsinfo(r) => st!(r),
            Self::Pathconf(r) => st!(r),
            Self::Commit(r) => st!(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfs3_types::xdr_codec::Opaque;
    use proptest::prelude::*;

    fn fh(bytes: Vec<u8>) -> nfs_fh3 {
        nfs_fh3 {
            data: Opaque::owned(bytes),
        }
    }

    #[test]
    fn calls_are_named_for_logs() {
        assert_eq!(CallName(NFS_PROGRAM, 6).to_string(), "READ");
        assert_eq!(CallName(MOUNT_PROGRAM, mount_procs::MNT).to_string(), "MNT");
        assert_eq!(CallName(MOUNT_PROGRAM, 0).to_string(), "MOUNT NULL");
        assert_eq!(CallName(MOUNT_PROGRAM, 9).to_string(), "100005/9");
        assert_eq!(CallName(NFS_PROGRAM, 22).to_string(), "100003/22");
        assert_eq!(CallName(7, 1).to_string(), "7/1");
    }

    #[test]
    fn every_procedure_error_reply_round_trips() {
        for p in NfsProc::ALL {
            let reply = NfsReply::error(p, nfsstat3::NFS3ERR_IO);
            let mut out = Vec::new();
            reply.encode(&mut out);
            let back = NfsReply::decode(p, &out).unwrap();
            assert_eq!(back.proc_(), p);
            if p != NfsProc::Null {
                assert_eq!(back.status(), nfsstat3::NFS3ERR_IO, "{}", p.name());
            }
        }
    }

    #[test]
    fn oversized_handle_is_refused() {
        let mut out = Vec::new();
        NfsRequest::Getattr(GETATTR3args {
            object: fh(vec![1; 65]),
        })
        .encode(&mut out);
        assert_eq!(
            NfsRequest::decode(1, &out).unwrap_err(),
            DecodeError::HandleTooLong(65)
        );
    }

    #[test]
    fn a_reply_handing_out_an_oversized_handle_is_refused() {
        let ok = |len: usize| {
            NfsReply::Lookup(Nfs3Result::Ok(LOOKUP3resok {
                object: fh(vec![7; len]),
                obj_attributes: Nfs3Option::None,
                dir_attributes: Nfs3Option::None,
            }))
        };
        let mut fits = Vec::new();
        ok(MAX_FH_LEN).encode(&mut fits);
        assert!(NfsReply::decode(NfsProc::Lookup, &fits).is_ok());
        let mut out = Vec::new();
        ok(1 << 20).encode(&mut out);
        assert_eq!(
            NfsReply::decode(NfsProc::Lookup, &out).unwrap_err(),
            DecodeError::HandleTooLong(1 << 20)
        );
        let create = NfsReply::Create(Nfs3Result::Ok(CREATE3resok {
            obj: Nfs3Option::Some(fh(vec![7; 65])),
            obj_attributes: Nfs3Option::None,
            dir_wcc: wcc_data {
                before: Nfs3Option::None,
                after: Nfs3Option::None,
            },
        }));
        let mut out = Vec::new();
        create.encode(&mut out);
        assert_eq!(
            NfsReply::decode(NfsProc::Create, &out).unwrap_err(),
            DecodeError::HandleTooLong(65)
        );
    }

    #[test]
    fn split_encoding_is_the_encoding() {
        let read = |data: Vec<u8>, attrs| {
            NfsReply::Read(Nfs3Result::Ok(READ3resok {
                file_attributes: attrs,
                count: data.len() as u32,
                eof: true,
                data: Opaque::owned(data),
            }))
        };
        let attrs = Nfs3Option::Some(crate::proc::raw::tests::attrs());
        for n in [0, 1, 2, 3, 4, 5, 4097] {
            for a in [Nfs3Option::None, attrs.clone()] {
                let data: Vec<u8> = (0..n).map(|i| i as u8).collect();
                let mut whole = Vec::new();
                read(data.clone(), a.clone()).encode(&mut whole);
                let mut head = Vec::new();
                let bulk = read(data, a).encode_split(&mut head);
                head.extend_from_slice(&bulk);
                head.resize(head.len().next_multiple_of(4), 0);
                assert_eq!(head, whole, "{n} bytes");
            }
        }
        let mut whole = Vec::new();
        NfsReply::error(NfsProc::Read, nfsstat3::NFS3ERR_IO).encode(&mut whole);
        let mut head = Vec::new();
        let bulk = NfsReply::error(NfsProc::Read, nfsstat3::NFS3ERR_IO).encode_split(&mut head);
        assert!(bulk.is_empty());
        assert_eq!(head, whole);
    }

    #[test]
    fn unknown_procedure_is_reported() {
        assert_eq!(
            NfsRequest::decode(22, &[]).unwrap_err(),
            DecodeError::UnknownProcedure(22)
        );
    }

    proptest! {
        #[test]
        fn write_args_round_trip(h in prop::collection::vec(any::<u8>(), 0..=64), offset: u64,
                                 data in prop::collection::vec(any::<u8>(), 0..5000)) {
            let req = NfsRequest::Write(WRITE3args {
                file: fh(h.clone()), offset, count: data.len() as u32,
                stable: stable_how::UNSTABLE, data: Opaque::owned(data.clone()),
            });
            let mut out = Vec::new();
            req.encode(&mut out);
            match NfsRequest::decode(7, &out).unwrap() {
                NfsRequest::Write(w) => {
                    prop_assert_eq!(w.file.data.to_vec(), h);
                    prop_assert_eq!(w.offset, offset);
                    prop_assert_eq!(w.data.to_vec(), data);
                }
                other => prop_assert!(false, "decoded {:?}", other.proc_()),
            }
        }

        /// Arbitrary bytes as arguments of any procedure never panic.
        #[test]
        fn garbage_args_never_panic(p in 0u32..23, bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = NfsRequest::decode(p, &bytes);
            if let Some(p) = NfsProc::from_u32(p) { let _ = NfsReply::decode(p, &bytes); }
        }

        /// A forged length in an opaque field does not allocate it: decoding
        /// 8 bytes that announce a 4 GiB name fails fast.
        #[test]
        fn forged_lengths_fail_fast(p in 0u32..22) {
            let mut bytes = vec![0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8];
            bytes.extend_from_slice(&[0xFF; 8]);
            let _ = NfsRequest::decode(p, &bytes);
        }
    }
}

/// Checks of READ and WRITE in their XDR form, for layers that forward them
/// without decoding the payload (RFC 1813 sections 3.3.6 and 3.3.7).
pub mod raw {
    use crate::xdr::{XdrError, XdrReader};

    use super::MAX_FH_LEN;

    /// Size of an encoded `fattr3`.
    const FATTR3_LEN: usize = 84;
    /// Size of an encoded `wcc_attr`.
    const WCC_ATTR_LEN: usize = 24;

    fn handle(r: &mut XdrReader<'_>) -> Result<(), XdrError> {
        r.opaque(MAX_FH_LEN).map(|_| ())
    }

    fn skip(r: &mut XdrReader<'_>, n: usize) -> Result<(), XdrError> {
        for _ in 0..n / 4 {
            r.u32()?;
        }
        Ok(())
    }

    fn optional(r: &mut XdrReader<'_>, len: usize) -> Result<(), XdrError> {
        match r.u32()? {
            0 => Ok(()),
            1 => skip(r, len),
            v => Err(XdrError::InvalidValue(v)),
        }
    }

    fn end(r: &XdrReader<'_>) -> Result<(), XdrError> {
        match r.rest().len() {
            0 => Ok(()),
            n => Err(XdrError::Trailing(n)),
        }
    }

    /// Checks READ3args; returns the count asked for.
    pub fn read_args(args: &[u8]) -> Result<u32, XdrError> {
        let mut r = XdrReader::new(args);
        handle(&mut r)?;
        skip(&mut r, 8)?;
        let count = r.u32()?;
        end(&r)?;
        Ok(count)
    }

    /// Checks WRITE3args; returns the length of the data.
    pub fn write_args(args: &[u8]) -> Result<usize, XdrError> {
        let mut r = XdrReader::new(args);
        handle(&mut r)?;
        skip(&mut r, 12)?;
        let stable = r.u32()?;
        if stable > 2 {
            return Err(XdrError::InvalidValue(stable));
        }
        let data = r.opaque(args.len())?;
        end(&r)?;
        Ok(data.len())
    }

    /// Checks READ3res; returns the length of the data read (0 on error).
    pub fn read_results(res: &[u8]) -> Result<usize, XdrError> {
        let mut r = XdrReader::new(res);
        let status = r.u32()?;
        optional(&mut r, FATTR3_LEN)?;
        let mut len = 0;
        if status == 0 {
            r.u32()?;
            match r.u32()? {
                0 | 1 => {}
                v => return Err(XdrError::InvalidValue(v)),
            }
            len = r.opaque(res.len())?.len();
        }
        end(&r)?;
        Ok(len)
    }

    /// Checks WRITE3res.
    pub fn write_results(res: &[u8]) -> Result<(), XdrError> {
        let mut r = XdrReader::new(res);
        let status = r.u32()?;
        optional(&mut r, WCC_ATTR_LEN)?;
        optional(&mut r, FATTR3_LEN)?;
        if status == 0 {
            r.u32()?;
            let committed = r.u32()?;
            if committed > 2 {
                return Err(XdrError::InvalidValue(committed));
            }
            skip(&mut r, 8)?;
        }
        end(&r)
    }

    #[cfg(test)]
    pub(crate) mod tests {
        use super::*;
        use crate::proc::{NfsReply, NfsRequest};
        use nfs3_types::nfs3::*;
        use nfs3_types::xdr_codec::Opaque;
        use proptest::prelude::*;

        /// Attributes of a small regular file, for tests.
        pub(crate) fn attrs() -> fattr3 {
            fattr3 {
                type_: ftype3::NF3REG,
                mode: 0o644,
                nlink: 1,
                uid: 1,
                gid: 2,
                size: 3,
                used: 4,
                rdev: specdata3::default(),
                fsid: 5,
                fileid: 6,
                atime: nfstime3::default(),
                mtime: nfstime3::default(),
                ctime: nfstime3::default(),
            }
        }

        proptest! {
            /// The raw checks accept exactly what the typed codec encodes,
            /// and agree on the payload length.
            #[test]
            fn agree_with_the_typed_codec(data in prop::collection::vec(any::<u8>(), 0..3000), with_attrs: bool) {
                let fh = nfs_fh3 { data: Opaque::owned(vec![9; 20]) };
                let mut w = Vec::new();
                NfsRequest::Write(WRITE3args { file: fh.clone(), offset: 7, count: data.len() as u32,
                    stable: stable_how::DATA_SYNC, data: Opaque::owned(data.clone()) }).encode(&mut w);
                prop_assert_eq!(write_args(&w), Ok(data.len()));
                prop_assert!(write_args(&w[..w.len() - 1]).is_err());
                let mut rd = Vec::new();
                NfsRequest::Read(READ3args { file: fh, offset: 1, count: 99 }).encode(&mut rd);
                prop_assert_eq!(read_args(&rd), Ok(99));
                let post = if with_attrs { Nfs3Option::Some(attrs()) } else { Nfs3Option::None };
                let mut res = Vec::new();
                NfsReply::Read(Nfs3Result::Ok(READ3resok { file_attributes: post.clone(), count: data.len() as u32,
                    eof: true, data: Opaque::owned(data.clone()) })).encode(&mut res);
                prop_assert_eq!(read_results(&res), Ok(data.len()));
                prop_assert!(read_results(&res[..res.len() - 1]).is_err());
                let mut res = Vec::new();
                NfsReply::Write(Nfs3Result::Ok(WRITE3resok { file_wcc: wcc_data { before: Nfs3Option::None, after: post },
                    count: 5, committed: stable_how::FILE_SYNC, verf: writeverf3([1; 8]) })).encode(&mut res);
                prop_assert_eq!(write_results(&res), Ok(()));
                let mut res = Vec::new();
                NfsReply::error(crate::proc::NfsProc::Read, nfsstat3::NFS3ERR_IO).encode(&mut res);
                prop_assert_eq!(read_results(&res), Ok(0));
            }

            #[test]
            fn never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
                let _ = (read_args(&bytes), write_args(&bytes), read_results(&bytes), write_results(&bytes));
            }
        }
    }
}
