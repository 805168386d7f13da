//! The RPC programs a front end answers, each behind [`Program`], and the
//! registry of them, [`Programs`], that the front end is given.
//!
//! The front end parses a call, finds its program by number, counts it,
//! checks its version against the program's range (PROG_MISMATCH with
//! that range, RFC 5531 section 9) and hands it over; a number nobody
//! registered is PROG_UNAVAIL. What a program's procedures mean, and how
//! large their replies may be, only the program knows: the front end names
//! no program's numbers. NFS v3, MOUNT v3 and PORTMAP v2 are the programs
//! of `front/`; the extension program between proxies registers beside
//! them (`crate::ext_server`).

use std::ops::RangeInclusive;
use std::sync::Arc;

use gvfs_nfs::layer::Counter;
use gvfs_nfs::rpc::{self, CallHeader, ReplyRecord, ReplyStatus};
use gvfs_nfs::xdr::{XdrError, XdrReader};
use gvfs_nfs::{BoxFuture, CallContext, Class};

use crate::drc::PeerId;

gvfs_nfs::counters! {
    /// What the front end counts, for `gvfsctl status` and the metrics
    /// endpoint (the calls of each NFS procedure apart).
    pub struct FrontCounters => FrontCounts {
        /// MOUNT calls.
        mount_calls,
        /// PORTMAP calls.
        portmap_calls,
        /// Bytes returned by READ.
        read_bytes,
        /// Bytes accepted by WRITE.
        write_bytes,
        /// Calls answered GARBAGE_ARGS, PROC_UNAVAIL, PROG_* or AUTH_ERROR.
        rpc_errors,
        /// NFS calls that failed below the front end (no reply from a
        /// layer).
        service_errors,
        /// Retransmissions answered or dropped by the duplicate-request
        /// cache.
        drc_hits,
        /// Calls of the gvfs extension program (compress-and-copy between
        /// proxies).
        ext_calls,
    }
}

impl FrontCounters {
    /// A reply record refusing call `xid` with `status`, counted.
    pub fn refuse(&self, xid: u32, status: ReplyStatus) -> Vec<u8> {
        self.rpc_errors.inc();
        rpc::reply_record(xid, status, &[])
    }
}

/// One call, as the front end hands it to its program.
pub struct Call<'a> {
    /// The call's header (its version is in the program's range).
    pub hdr: &'a CallHeader,
    /// The caller, with its credentials mapped.
    pub cx: &'a CallContext,
    /// Who sent it, for the duplicate-request cache.
    pub peer: PeerId,
    /// The procedure's arguments, XDR.
    pub args: &'a [u8],
    /// The front end's counters.
    pub counters: &'a FrontCounters,
}

/// What a program answers a call with.
pub enum Answer {
    /// The procedure's results, to follow an accepted reply's header.
    Results(Vec<u8>),
    /// A whole reply record the program built itself (a READ's data
    /// uncopied, a reply replayed from the duplicate-request cache).
    Record(ReplyRecord),
    /// Refused at the RPC level: PROC_UNAVAIL, GARBAGE_ARGS, ...
    Refused(ReplyStatus),
    /// No reply: the call is dropped (a retransmission whose original
    /// still runs).
    Dropped,
}

/// An RPC program a front end answers.
pub trait Program: Send + Sync {
    /// Its program number.
    fn number(&self) -> u32;

    /// The versions it serves, lowest to highest: a call of another is
    /// answered PROG_MISMATCH with this range.
    fn versions(&self) -> RangeInclusive<u32>;

    /// The version PORTMAP names for it on this proxy's port, if it is
    /// advertised there.
    fn advertised(&self) -> Option<u32> {
        None
    }

    /// The front end's counter of this program's calls, if it has one
    /// (counted before the version is checked).
    fn calls_counter<'c>(&self, _counters: &'c FrontCounters) -> Option<&'c Counter> {
        None
    }

    /// The most bytes of data the reply to procedure `proc_` of version
    /// `vers` may carry, as far as its arguments (read from `args`) say,
    /// beyond a small reply; 0 for a small reply. For the server edge's
    /// memory budget: it reads only what it needs.
    fn reply_data(
        &self,
        _vers: u32,
        _proc_: u32,
        _args: &mut XdrReader<'_>,
    ) -> Result<u32, XdrError> {
        Ok(0)
    }

    /// The class of procedure `proc_` of version `vers` with XDR `args`:
    /// where its reply goes when replies wait to be written (the highest
    /// class first). A reader waits behind every call of a file system
    /// program, so the default is [`Class::Demand`].
    fn class(&self, _vers: u32, _proc_: u32, _args: &[u8]) -> Class {
        Class::Demand
    }

    /// Answers one call.
    fn answer<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Answer>;
}

/// The programs a front end answers, by number.
#[derive(Clone, Default)]
pub struct Programs {
    list: Vec<Arc<dyn Program>>,
}

impl std::fmt::Debug for Programs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.list.iter().map(|p| p.number()))
            .finish()
    }
}

impl Programs {
    /// `list`, in the order PORTMAP lists them; a number given twice is
    /// answered by its first.
    pub fn new(list: Vec<Arc<dyn Program>>) -> Programs {
        Programs { list }
    }

    /// The program numbered `prog`, if it is registered.
    pub fn get(&self, prog: u32) -> Option<&Arc<dyn Program>> {
        self.list.iter().find(|p| p.number() == prog)
    }

    /// The (program, version) pairs PORTMAP advertises, in order.
    pub fn advertised(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.list
            .iter()
            .filter_map(|p| p.advertised().map(|v| (p.number(), v)))
    }
}
