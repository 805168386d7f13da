//! Decodes arbitrary bytes as an RPC call and, when the header parses, its
//! NFSv3 arguments (and as every procedure's reply): never a panic, and
//! never an allocation driven by a forged length.
#![no_main]

use gvfs_nfs::proc::{NfsProc, NfsReply, NfsRequest};
use gvfs_nfs::rpc;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((hdr, at)) = rpc::parse_call(data) {
        let _ = NfsRequest::decode(hdr.proc_, &data[at..]);
    }
    let _ = rpc::parse_reply(data);
    if let Some((&p, rest)) = data.split_first() {
        if let Some(p) = NfsProc::from_u32(u32::from(p % 22)) {
            let _ = NfsReply::decode(p, rest);
        }
    }
});
