use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};

use super::*;

fn state_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gvfs-keeper-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A keeper serving in a thread, holding one end of a socket pair in
/// place of the connection.
fn keeper(name: &str) -> (PathBuf, UnixStream, std::thread::JoinHandle<()>) {
    let state = state_dir(name);
    let listener = UnixListener::bind(state.join(SOCKET)).unwrap();
    let (held, other) = UnixStream::pair().unwrap();
    let thread = std::thread::spawn(move || serve(&OwnedFd::from(held), &listener, "s1"));
    (state, other, thread)
}

#[test]
fn a_given_copy_is_the_same_connection() {
    let (state, mut other, thread) = keeper("give");
    let (k, fd) = Keeper::give(&state).unwrap().expect("a keeper answers");
    assert_eq!(k.session(), "s1");
    // What is written through the copy arrives at the other end: the
    // copy is the keeper's descriptor, not a new one.
    let mut copy = UnixStream::from(fd);
    copy.write_all(b"through the copy").unwrap();
    let mut buf = [0u8; 16];
    other.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"through the copy");
    k.ping().unwrap();
    k.stop().unwrap();
    thread.join().unwrap();
    // Stopped: nobody answers any more.
    assert!(Keeper::give(&state).unwrap().is_none() || k.ping().is_err());
    std::fs::remove_dir_all(&state).unwrap();
}

#[test]
fn the_keeper_ends_with_the_connection() {
    let (state, other, thread) = keeper("ends");
    drop(other);
    thread.join().unwrap();
    std::fs::remove_dir_all(&state).unwrap();
}

#[test]
fn no_keeper_is_none_and_a_wrong_session_is_refused() {
    let state = state_dir("none");
    assert!(Keeper::give(&state).unwrap().is_none());
    let (state2, _other, thread) = keeper("wrong");
    let k = Keeper {
        socket: state2.join(SOCKET),
        session: "another".into(),
    };
    let e = k.stop().unwrap_err();
    assert!(e.to_string().contains("holds session s1"), "{e}");
    // The refused stop did not stop it.
    let (k, _fd) = Keeper::give(&state2).unwrap().unwrap();
    k.stop().unwrap();
    thread.join().unwrap();
    std::fs::remove_dir_all(&state).unwrap();
    std::fs::remove_dir_all(&state2).unwrap();
}

#[test]
fn an_unknown_command_is_answered_and_changes_nothing() {
    let (state, _other, thread) = keeper("unknown");
    let mut s = UnixStream::connect(state.join(SOCKET)).unwrap();
    s.write_all(b"take everything\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "error unknown command\n");
    let (k, _fd) = Keeper::give(&state).unwrap().unwrap();
    k.stop().unwrap();
    thread.join().unwrap();
    std::fs::remove_dir_all(&state).unwrap();
}
