//! The patched fuser session (`vendor/fuser/PATCHED.md`) as a takeover uses
//! it: a session made on an initialized connection answers without an INIT,
//! and a paused session leaves the next request, unread, to the session
//! that takes over.
//!
//! A `SOCK_SEQPACKET` socket pair stands in for `/dev/fuse`: one end is the
//! session's device, the other plays the kernel. Like `/dev/fuse`, each
//! read returns one whole message, and a blocking read returns EINTR for a
//! signal whose handler has no `SA_RESTART`.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use fuser::{Config, Errno, Filesystem, INodeNo, ReplyEntry, Request, Session, SessionACL};

/// How long a test waits for a reply or a pause before it fails (never
/// reached when the session works).
const PATIENCE: Duration = Duration::from_secs(20);

/// FUSE_LOOKUP (`fuse_opcode`, `ll/fuse_abi.rs`).
const FUSE_LOOKUP: u32 = 1;
/// `size_of::<fuse_in_header>()` and `size_of::<fuse_out_header>()`.
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

/// Answers every LOOKUP with one errno, which tells the sessions apart.
struct Answer(Errno);

impl Filesystem for Answer {
    fn lookup(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEntry) {
        reply.error(self.0);
    }
}

/// (the kernel's end, the device's end)
fn socket_pair() -> (File, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "socketpair: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are fresh and owned by nothing else.
    unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn config() -> Config {
    let mut config = Config::default();
    // As gvfs mounts: several readers on one file description.
    config.n_threads = Some(4);
    config
}

/// A FUSE_LOOKUP of "x" in the root: a `fuse_in_header` (len, opcode,
/// unique, nodeid, uid, gid, pid, total_extlen, padding) and the name.
fn lookup(unique: u64) -> Vec<u8> {
    let name = b"x\0";
    let mut m = Vec::with_capacity(IN_HEADER + name.len());
    m.extend_from_slice(&((IN_HEADER + name.len()) as u32).to_ne_bytes());
    m.extend_from_slice(&FUSE_LOOKUP.to_ne_bytes());
    m.extend_from_slice(&unique.to_ne_bytes());
    m.extend_from_slice(&1u64.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes());
    m.extend_from_slice(&[0; 4]);
    m.extend_from_slice(name);
    m
}

/// Whether `fd` has a message to read now.
fn readable(fd: BorrowedFd<'_>, wait: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, wait.as_millis() as libc::c_int) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    n == 1 && p.revents & libc::POLLIN != 0
}

/// Reads one reply, a bare `fuse_out_header` (len, error, unique), and
/// returns its `(unique, error)`.
fn reply(kernel: &mut File) -> (u64, i32) {
    assert!(readable(kernel.as_fd(), PATIENCE), "no reply came");
    let mut buf = [0u8; 64];
    let n = kernel.read(&mut buf).expect("reading a reply");
    assert_eq!(n, OUT_HEADER, "an error reply is a bare header");
    let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
    assert_eq!(len as usize, OUT_HEADER);
    let error = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let mut unique = [0; 8];
    unique.copy_from_slice(&buf[8..16]);
    let unique = u64::from_ne_bytes(unique);
    (unique, error)
}

#[test]
fn a_session_on_an_initialized_connection_answers_its_first_request_without_an_init() {
    let (mut kernel, dev) = socket_pair();
    // Already waiting: `Session::from_fd` would read it as its handshake,
    // answer EIO and fail.
    kernel.write_all(&lookup(7)).unwrap();

    let session =
        Session::from_initialized_fd(Answer(Errno::ENOENT), dev, SessionACL::All, config())
            .unwrap();
    assert!(
        readable(session.as_fd(), Duration::ZERO),
        "making the session read nothing"
    );
    let bg = session.spawn().unwrap();

    assert_eq!(reply(&mut kernel), (7, -libc::ENOENT));
    bg.pause(PATIENCE).unwrap();
}

#[test]
fn a_paused_session_leaves_the_next_request_to_the_session_taking_over() {
    let (mut kernel, dev) = socket_pair();
    let first = Session::from_initialized_fd(
        Answer(Errno::ENOENT),
        dev.try_clone().unwrap(),
        SessionACL::All,
        config(),
    )
    .unwrap();
    let mut first = first.spawn().unwrap();
    kernel.write_all(&lookup(1)).unwrap();
    assert_eq!(reply(&mut kernel), (1, -libc::ENOENT));

    // Its four readers are blocked in read(2): only the signal ends them.
    first.pause(PATIENCE).unwrap();
    assert!(first.guard.is_finished());

    kernel.write_all(&lookup(2)).unwrap();
    assert!(
        readable(dev.as_fd(), Duration::ZERO),
        "the request after the pause stays unread"
    );
    assert!(
        !readable(kernel.as_fd(), Duration::ZERO),
        "and nobody answered it"
    );

    // The takeover: a new session on another copy of the same description.
    let second =
        Session::from_initialized_fd(Answer(Errno::EACCES), dev, SessionACL::All, config())
            .unwrap();
    let second = second.spawn().unwrap();
    assert_eq!(reply(&mut kernel), (2, -libc::EACCES));

    // The paused session can be let go of without ending anything.
    first.forget_mount();
    first.join().unwrap();
    kernel.write_all(&lookup(3)).unwrap();
    assert_eq!(reply(&mut kernel), (3, -libc::EACCES));

    second.pause(PATIENCE).unwrap();
}

#[test]
fn a_pause_stops_readers_started_by_a_thread_that_blocks_every_signal() {
    let (mut kernel, dev) = socket_pair();
    // Threads inherit their creator's signal mask, so the readers start
    // with the pause's signal blocked.
    let bg = std::thread::spawn(move || {
        // SAFETY: a full set, applied to this thread only.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
        }
        Session::from_initialized_fd(Answer(Errno::ENOENT), dev, SessionACL::All, config())
            .unwrap()
            .spawn()
            .unwrap()
    })
    .join()
    .unwrap();
    kernel.write_all(&lookup(1)).unwrap();
    assert_eq!(reply(&mut kernel), (1, -libc::ENOENT));

    bg.pause(PATIENCE).unwrap();
    kernel.write_all(&lookup(2)).unwrap();
    assert!(!readable(kernel.as_fd(), Duration::ZERO));
}
