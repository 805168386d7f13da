//! The class of each extension-program call at the serving edge: where its
//! reply waits when replies queue on a connection (`server/replies.rs`).
//!
//! | procedure | class |
//! |---|---|
//! | FETCH, FETCH_REPEATS, STORE, STORE_GUARDED | background |
//! | FETCH_DEMAND, PROFILE_PUT, PROFILE_GET, NULL, HELLO | demand |
//! | FETCH_HAVE | demand if its `demand` flag is set, else background |
//! | FETCH_CLASS | the class it carries (background if it names none) |
//!
//! Only the few words that decide the class are read; a call whose
//! arguments do not parse gets the class its procedure has, and is refused
//! GARBAGE_ARGS when it runs.

use gvfs_ext as ext;
use gvfs_nfs::Class;
use gvfs_nfs::xdr::{XdrError, XdrReader};

/// The class of procedure `proc_` of version `vers` with XDR `args`.
pub(crate) fn ext_call_class(_vers: u32, proc_: u32, args: &[u8]) -> Class {
    match proc_ {
        ext::PROC_FETCH | ext::PROC_FETCH_REPEATS | ext::PROC_STORE | ext::PROC_STORE_GUARDED => {
            Class::Background
        }
        ext::PROC_FETCH_HAVE => match after_fetch_args(args) {
            Ok(1) => Class::Demand,
            _ => Class::Background,
        },
        ext::PROC_FETCH_CLASS => after_fetch_args(args)
            .ok()
            .and_then(Class::from_wire)
            .unwrap_or(Class::Background),
        _ => Class::Demand,
    }
}

/// The `uint32` that follows FETCH arguments (handle, offset, count).
fn after_fetch_args(args: &[u8]) -> Result<u32, XdrError> {
    let mut r = XdrReader::new(args);
    r.opaque(gvfs_nfs::proc::MAX_FH_LEN)?;
    r.u64()?;
    r.u32()?;
    r.u32()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gvfs_nfs::xdr::{put_opaque, put_u32, put_u64};

    fn fetch_then(word: u32) -> Vec<u8> {
        let mut a = Vec::new();
        put_opaque(&mut a, b"handle");
        put_u64(&mut a, 1 << 20);
        put_u32(&mut a, 1 << 20);
        put_u32(&mut a, word);
        a
    }

    #[test]
    fn each_procedure_has_its_class() {
        let v = ext::VERSION;
        for p in [
            ext::PROC_FETCH,
            ext::PROC_FETCH_REPEATS,
            ext::PROC_STORE,
            ext::PROC_STORE_GUARDED,
        ] {
            assert_eq!(ext_call_class(v, p, &[]), Class::Background, "proc {p}");
        }
        for p in [
            ext::PROC_NULL,
            ext::PROC_FETCH_DEMAND,
            ext::PROC_PROFILE_PUT,
            ext::PROC_PROFILE_GET,
            ext::PROC_HELLO,
        ] {
            assert_eq!(ext_call_class(v, p, &[]), Class::Demand, "proc {p}");
        }
        let have = ext::PROC_FETCH_HAVE;
        assert_eq!(ext_call_class(v, have, &fetch_then(1)), Class::Demand);
        assert_eq!(ext_call_class(v, have, &fetch_then(0)), Class::Background);
        assert_eq!(ext_call_class(v, have, &[1, 2]), Class::Background);
        for c in Class::ALL {
            let args = fetch_then(c.wire());
            assert_eq!(ext_call_class(v, ext::PROC_FETCH_CLASS, &args), c);
        }
        for bad in [fetch_then(4), vec![0; 3]] {
            let class = ext_call_class(v, ext::PROC_FETCH_CLASS, &bad);
            assert_eq!(class, Class::Background);
        }
    }
}
