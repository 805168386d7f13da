//! PORTMAP v2 on the proxy's own port (RFC 1833 section 3): NULL, GETPORT
//! and DUMP for the programs this proxy serves, so a client that always asks
//! the portmapper at HOST:111 (QEMU's `nfs://` driver) finds the proxy when it
//! listens on 127.0.0.N:111, with no rpcbind running.

use std::ops::RangeInclusive;

use gvfs_nfs::BoxFuture;
use gvfs_nfs::layer::Counter;
use gvfs_nfs::portmap::{self, IPPROTO_TCP, Mapping, procs};
use gvfs_nfs::rpc::ReplyStatus;
use gvfs_nfs::xdr;

use super::program::{Answer, Call, FrontCounters, Program, Programs};

/// PORTMAP v2, naming this proxy's port for the programs it advertises.
pub struct PortmapProgram {
    mappings: Vec<Mapping>,
}

impl PortmapProgram {
    /// PORTMAP on `port`, advertising itself and then the programs of
    /// `others` that are advertised.
    pub fn new(port: u16, others: &Programs) -> Self {
        let port = u32::from(port);
        let mappings = std::iter::once((portmap::PROGRAM, portmap::VERSION))
            .chain(others.advertised())
            .map(|(prog, vers)| Mapping {
                prog,
                vers,
                prot: IPPROTO_TCP,
                port,
            })
            .collect();
        Self { mappings }
    }

    fn call(&self, call: Call<'_>) -> Answer {
        let mut out = Vec::new();
        match call.hdr.proc_ {
            procs::NULL => {}
            procs::GETPORT => {
                let Ok(q) = Mapping::decode(call.args) else {
                    return Answer::Refused(ReplyStatus::GarbageArgs);
                };
                let port = self
                    .mappings
                    .iter()
                    .find(|m| m.prog == q.prog && m.vers == q.vers && m.prot == q.prot)
                    .map_or(0, |m| m.port);
                xdr::put_u32(&mut out, port);
            }
            procs::DUMP => portmap::encode_dump(&self.mappings, &mut out),
            _ => return Answer::Refused(ReplyStatus::ProcUnavail),
        }
        Answer::Results(out)
    }
}

impl Program for PortmapProgram {
    fn number(&self) -> u32 {
        portmap::PROGRAM
    }

    fn versions(&self) -> RangeInclusive<u32> {
        portmap::VERSION..=portmap::VERSION
    }

    fn calls_counter<'c>(&self, counters: &'c FrontCounters) -> Option<&'c Counter> {
        Some(&counters.portmap_calls)
    }

    fn answer<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Answer> {
        let answer = self.call(call);
        Box::pin(async move { answer })
    }
}
