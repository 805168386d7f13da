//! PORTMAP v2 on the proxy's own port (RFC 1833 section 3): NULL, GETPORT
//! and DUMP for the programs this proxy serves, so a client that always asks
//! the portmapper at HOST:111 (QEMU's `nfs://` driver) finds the proxy when it
//! listens on 127.0.0.N:111, with no rpcbind running.

use gvfs_nfs::portmap::{self, IPPROTO_TCP, Mapping, procs};
use gvfs_nfs::rpc::{self, CallHeader, ReplyStatus};
use gvfs_nfs::xdr;

use super::{FrontEnd, MOUNT_PROGRAM, NFS_PROGRAM};

impl FrontEnd {
    fn mappings(&self) -> Vec<Mapping> {
        let port = u32::from(self.port);
        [
            (portmap::PROGRAM, portmap::VERSION),
            (NFS_PROGRAM, 3),
            (MOUNT_PROGRAM, 3),
        ]
        .into_iter()
        .map(|(prog, vers)| Mapping {
            prog,
            vers,
            prot: IPPROTO_TCP,
            port,
        })
        .collect()
    }

    pub(super) fn portmap(&self, hdr: &CallHeader, args: &[u8]) -> Vec<u8> {
        if hdr.vers != portmap::VERSION {
            let v = portmap::VERSION;
            return self.error(hdr.xid, ReplyStatus::ProgMismatch { low: v, high: v });
        }
        let mut out = Vec::new();
        match hdr.proc_ {
            procs::NULL => {}
            procs::GETPORT => {
                let Ok(q) = Mapping::decode(args) else {
                    return self.error(hdr.xid, ReplyStatus::GarbageArgs);
                };
                let port = self
                    .mappings()
                    .iter()
                    .find(|m| m.prog == q.prog && m.vers == q.vers && m.prot == q.prot)
                    .map_or(0, |m| m.port);
                xdr::put_u32(&mut out, port);
            }
            procs::DUMP => portmap::encode_dump(&self.mappings(), &mut out),
            _ => return self.error(hdr.xid, ReplyStatus::ProcUnavail),
        }
        rpc::reply_record(hdr.xid, ReplyStatus::Success, &out)
    }
}
