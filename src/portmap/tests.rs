use gvfs_nfs::rpc::{self, ReplyStatus};
use gvfs_nfs::xdr;

use super::protocol::*;
use super::*;

#[test]
fn uaddr_round_trip() {
    let ip: IpAddr = "127.0.0.1"
        .parse()
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(format_uaddr(ip, 2049), "127.0.0.1.8.1");
    assert_eq!(
        parse_uaddr("127.0.0.1.8.1"),
        Some(("127.0.0.1".to_owned(), 2049))
    );
    assert_eq!(
        parse_uaddr("::ffff:127.0.0.1.80.10"),
        Some(("::ffff:127.0.0.1".to_owned(), 20490))
    );
    assert_eq!(parse_uaddr("::.0.111"), Some(("::".to_owned(), 111)));
    assert_eq!(parse_uaddr("1.2.3.4.256.1"), None);
    assert_eq!(parse_uaddr("nonsense"), None);
}

fn reg(netid: &str, uaddr: &str) -> Registration {
    Registration {
        prog: 100_003,
        vers: 3,
        netid: netid.to_owned(),
        uaddr: uaddr.to_owned(),
        owner: String::new(),
        pid: None,
    }
}

#[test]
fn lookup_prefers_the_local_address_then_the_latest() {
    let regs = vec![
        reg("tcp", "127.0.0.2.0.2"),
        reg("tcp", "127.0.0.1.0.1"),
        reg("tcp6", "::ffff:127.0.0.3.0.3"),
        reg("udp", "127.0.0.1.0.4"),
    ];
    let tcp = ["tcp", "tcp6"];
    let at = |ip: &str| ip.parse::<IpAddr>().ok();
    assert_eq!(
        lookup(&regs, 100_003, Some(3), &tcp, at("127.0.0.2")).and_then(Registration::port),
        Some(2)
    );
    assert_eq!(
        lookup(&regs, 100_003, Some(3), &tcp, at("127.0.0.3")).and_then(Registration::port),
        Some(3)
    );
    assert_eq!(
        lookup(&regs, 100_003, Some(3), &tcp, at("127.0.0.9")).and_then(Registration::port),
        Some(3)
    );
    assert_eq!(
        lookup(&regs, 100_003, Some(3), &["udp"], None).and_then(Registration::port),
        Some(4)
    );
    assert!(lookup(&regs, 100_005, Some(3), &tcp, None).is_none());
}

fn call(shared: &Shared, vers: u32, proc_: u32, args: &[u8], pid: Option<u32>) -> Vec<u8> {
    let mut rec = rpc::call_record(1, pm::PROGRAM, vers, proc_, &Credentials::unix(0, 0));
    rec.extend_from_slice(args);
    let rec = rpc::seal(rec);
    let peer = Peer {
        transport: "unix",
        pid,
        local: None,
    };
    let reply = handle(shared, &rec[4..], &peer).unwrap_or_default();
    rpc::parse_reply(&reply[4..])
        .map(<[u8]>::to_vec)
        .unwrap_or_default()
}

fn rpcb_args(netid: &str, addr: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode_rpcb(&reg(netid, addr), &mut out);
    out
}

#[test]
fn set_getport_unset_per_pid() {
    let shared = Shared::default();
    let me = std::process::id();
    // Two registrants (this process, and one without a pid).
    assert_eq!(
        call(
            &shared,
            3,
            rpcb_procs::SET,
            &rpcb_args("tcp", "127.0.0.1.0.7"),
            None
        ),
        xdr_bool(true)
    );
    assert_eq!(
        call(
            &shared,
            3,
            rpcb_procs::SET,
            &rpcb_args("tcp", "127.0.0.1.0.9"),
            Some(me)
        ),
        xdr_bool(true)
    );
    let mut q = Vec::new();
    Mapping {
        prog: 100_003,
        vers: 3,
        prot: pm::IPPROTO_TCP,
        port: 0,
    }
    .encode(&mut q);
    assert_eq!(
        call(&shared, 2, pm::procs::GETPORT, &q, None),
        9u32.to_be_bytes()
    );
    let mut addr = Vec::new();
    xdr::put_opaque(&mut addr, b"127.0.0.1.0.9");
    assert_eq!(
        call(&shared, 4, rpcb_procs::GETADDR, &rpcb_args("tcp", ""), None),
        addr
    );
    // UNSET with an empty netid from `me` removes only `me`'s entry.
    assert_eq!(
        call(&shared, 3, rpcb_procs::UNSET, &rpcb_args("", ""), Some(me)),
        xdr_bool(true)
    );
    assert_eq!(
        call(&shared, 2, pm::procs::GETPORT, &q, None),
        7u32.to_be_bytes()
    );
    // Unknown procedures are PROC_UNAVAIL; a bad rpcb is GARBAGE_ARGS.
    let mut rec = rpc::call_record(5, pm::PROGRAM, 3, 8, &Credentials::None);
    rec = rpc::seal(rec);
    let peer = Peer {
        transport: "tcp",
        pid: None,
        local: None,
    };
    let reply = handle(&shared, &rec[4..], &peer).unwrap_or_default();
    assert!(matches!(
        rpc::parse_reply(&reply[4..]),
        Err(rpc::ReplyError::Accepted(ReplyStatus::ProcUnavail))
    ));
    let mut rec = rpc::call_record(6, pm::PROGRAM, 3, rpcb_procs::SET, &Credentials::None);
    xdr::put_u32(&mut rec, 1);
    rec = rpc::seal(rec);
    let reply = handle(&shared, &rec[4..], &peer).unwrap_or_default();
    assert!(matches!(
        rpc::parse_reply(&reply[4..]),
        Err(rpc::ReplyError::Accepted(ReplyStatus::GarbageArgs))
    ));
}
