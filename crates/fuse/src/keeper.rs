//! The keeper: a small process that holds a copy of the mount's
//! `/dev/fuse` descriptor, so the FUSE connection outlives the proxy that
//! serves it. The kernel ends a FUSE connection when the last copy of its
//! descriptor closes, and with it every guest that maps a file from the
//! mount; while the keeper holds one, a proxy killed -9 leaves a mount
//! whose requests wait, and the next proxy asks the keeper for the
//! descriptor and takes the session over.
//!
//! The keeper is the proxy's own binary run as `gvfs-proxy __keep-fuse
//! STATE SESSION` (dispatched before anything else starts), with the
//! connection as its fd 3 and its listening socket, `STATE/keeper.sock`,
//! as fd 4; its pid is in `STATE/keeper.pid` while it runs. It never
//! reads the connection: it waits in `poll(2)` for the connection to end
//! (POLLERR: unmounted or aborted), then exits. On its
//! socket it answers one command per connection, from the same user only:
//!
//! | command | answer |
//! |---|---|
//! | `ping` | `ok SESSION` |
//! | `give` | `ok SESSION`, with a copy of the descriptor (SCM_RIGHTS) |
//! | `stop SESSION` | `ok SESSION`, then it lets go and exits (the mount is being torn down); `error` for another session |
//!
//! Copies are `dup`s of the one open file description, never
//! `FUSE_DEV_IOC_CLONE`s: the kernel resends only requests read through a
//! description that is still open.

use std::ffi::OsString;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// The first argument that makes the proxy's binary a keeper.
pub const KEEPER_ARG: &str = "__keep-fuse";

/// The keeper's socket, in the session's state directory.
pub(crate) const SOCKET: &str = "keeper.sock";

/// The keeper's pid, in the session's state directory, while it runs.
pub(crate) const PID_FILE: &str = "keeper.pid";

/// How long a command and its answer may take, each way.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest command or answer line.
const MAX_LINE: usize = 128;

/// The descriptors the keeper is started with.
const DEV_FD: i32 = 3;
const LISTEN_FD: i32 = 4;

/// A keeper serving one session.
#[derive(Debug)]
pub(crate) struct Keeper {
    socket: PathBuf,
    session: String,
}

impl Keeper {
    /// Starts a keeper of `dev` for session `session`, running `exe`
    /// (the proxy's binary). It is in a session of its own, so a signal
    /// to the proxy's process group or terminal does not reach it, and it
    /// outlives the proxy. Its socket is bound before this returns, so it
    /// answers at once.
    pub(crate) fn start(
        exe: &Path,
        state: &Path,
        session: &str,
        dev: BorrowedFd<'_>,
    ) -> io::Result<Self> {
        let socket = state.join(SOCKET);
        match std::fs::remove_file(&socket) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(&socket)?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
        let dev_raw = dev.as_raw_fd();
        let listen_raw = listener.as_raw_fd();
        let mut cmd = Command::new(exe);
        cmd.arg(KEEPER_ARG)
            .arg(state)
            .arg(session)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: between fork and exec the closure calls only
        // async-signal-safe functions (setsid, dup2) and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                // dup2 clears close-on-exec on the copy; both sources are
                // above 4 unless they already are 3 and 4, which dup2
                // handles (same fd: flags are kept, so clear them).
                for (from, to) in [(dev_raw, DEV_FD), (listen_raw, LISTEN_FD)] {
                    if from == to {
                        if libc::fcntl(to, libc::F_SETFD, 0) < 0 {
                            return Err(io::Error::last_os_error());
                        }
                    } else if libc::dup2(from, to) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        if dev_raw == LISTEN_FD || listen_raw == DEV_FD {
            return Err(io::Error::other(
                "the connection and the keeper's socket sit on each other's descriptor numbers",
            ));
        }
        let mut child = cmd.spawn()?;
        // Written here too, before the proxy says it is ready: a proxy
        // killed at once still leaves the keeper's pid (the keeper writes
        // it again as it starts).
        if let Err(e) = write_pid(state, child.id()) {
            tracing::warn!(error = %e, "cannot write the keeper's pid file");
        }
        // Reap it if it ends while this process lives (else it is
        // re-parented when this process ends).
        std::thread::Builder::new()
            .name("fuse-keeper-reaper".into())
            .spawn(move || {
                let _ = child.wait();
            })?;
        drop(listener);
        Ok(Self {
            socket,
            session: session.to_string(),
        })
    }

    /// The keeper of `state`, if one answers: its session and a copy of
    /// the connection.
    pub(crate) fn give(state: &Path) -> io::Result<Option<(Self, OwnedFd)>> {
        let socket = state.join(SOCKET);
        let mut stream = match UnixStream::connect(&socket) {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        stream.write_all(b"give\n")?;
        let (line, fd) = recv_line(&stream)?;
        let session = parse_ok(&line)?;
        let fd =
            fd.ok_or_else(|| io::Error::other("the keeper answered without the connection"))?;
        Ok(Some((Self { socket, session }, fd)))
    }

    /// The session the keeper holds.
    pub(crate) fn session(&self) -> &str {
        &self.session
    }

    /// Whether the keeper still answers, for the session it was started for.
    #[cfg(test)]
    pub(crate) fn ping(&self) -> io::Result<()> {
        self.command("ping")
    }

    /// Tells the keeper to let go of its copy and exit: the mount is
    /// being torn down.
    pub(crate) fn stop(&self) -> io::Result<()> {
        self.command(&format!("stop {}", self.session))
    }

    fn command(&self, cmd: &str) -> io::Result<()> {
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        stream.write_all(format!("{cmd}\n").as_bytes())?;
        let (line, _) = recv_line(&stream)?;
        let session = parse_ok(&line)?;
        if session != self.session {
            return Err(io::Error::other(format!(
                "the keeper at {} holds session {session}, not {}",
                self.socket.display(),
                self.session
            )));
        }
        Ok(())
    }
}

/// The keeper process: `ARGS` are what follows [`KEEPER_ARG`] (the state
/// directory and the session). Returns the exit code. Runs before any
/// runtime starts, on std only.
pub fn run_keeper(args: &[OsString]) -> u8 {
    let [state, session] = args else {
        eprintln!("usage: gvfs-proxy {KEEPER_ARG} STATE_DIR SESSION (started by the proxy itself)");
        return 2;
    };
    let session = session.to_string_lossy().into_owned();
    // SAFETY: the proxy starts the keeper with the connection as fd 3 and
    // its bound socket as fd 4; nothing else in this process owns them.
    // Checked first: an fd that is not open fails F_GETFD.
    let open = |fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
    if !open(DEV_FD) || !open(LISTEN_FD) {
        eprintln!("gvfs-proxy {KEEPER_ARG}: fds 3 and 4 must be the connection and the socket");
        return 2;
    }
    // SAFETY: as above.
    let dev = unsafe { OwnedFd::from_raw_fd(DEV_FD) };
    // SAFETY: as above.
    let listener = unsafe { UnixListener::from_raw_fd(LISTEN_FD) };
    // Nothing else the proxy had open without close-on-exec (a pipe its
    // own parent reads to its end) may be kept open by the keeper.
    // SAFETY: close_range closes descriptors only; 3 and 4 are kept.
    unsafe { libc::syscall(libc::SYS_close_range, 5u32, u32::MAX, 0u32) };
    for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGPIPE] {
        // SAFETY: ignoring a signal has no preconditions.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let pid_file = Path::new(state).join(PID_FILE);
    let pid = format!("{}\n", std::process::id());
    let _ = write_pid(Path::new(state), std::process::id());
    serve(&dev, &listener, &session);
    if std::fs::read_to_string(&pid_file).is_ok_and(|p| p == pid) {
        let _ = std::fs::remove_file(&pid_file);
    }
    0
}

/// Writes `pid` to `state`'s pid file whole (a reader never sees part).
fn write_pid(state: &Path, pid: u32) -> io::Result<()> {
    let tmp = state.join(format!("{PID_FILE}.{pid}"));
    std::fs::write(&tmp, format!("{pid}\n"))?;
    std::fs::rename(&tmp, state.join(PID_FILE))
}

/// Answers commands until the connection ends or a `stop`.
fn serve(dev: &OwnedFd, listener: &UnixListener, session: &str) {
    loop {
        let mut fds = [
            // No events asked: only POLLERR (the connection ended) and
            // POLLHUP wake it; POLLIN (requests waiting) must not.
            libc::pollfd {
                fd: dev.as_raw_fd(),
                events: 0,
                revents: 0,
            },
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfds for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            return;
        }
        if fds[1].revents & libc::POLLIN != 0
            && let Ok((stream, _)) = listener.accept()
            && answer(stream, dev.as_fd(), session) == Some(Cmd::Stop)
        {
            return;
        }
    }
}

#[derive(PartialEq, Eq)]
enum Cmd {
    Ping,
    Give,
    Stop,
}

/// Reads one command from `stream` and answers it. `None` when the
/// peer is not this user, or the command is not understood.
fn answer(stream: UnixStream, dev: BorrowedFd<'_>, session: &str) -> Option<Cmd> {
    let peer = rustix::net::sockopt::socket_peercred(&stream).ok()?;
    let me = rustix::process::geteuid();
    if peer.uid != me && !peer.uid.is_root() {
        return None;
    }
    stream.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).ok()?;
    let mut buf = [0u8; MAX_LINE];
    let mut len = 0;
    let mut reader = &stream;
    while !buf[..len].contains(&b'\n') && len < buf.len() {
        match reader.read(&mut buf[len..]) {
            Ok(0) | Err(_) => return None,
            Ok(n) => len += n,
        }
    }
    let line = buf[..len].split(|b| *b == b'\n').next()?;
    let cmd = match line {
        b"ping" => Cmd::Ping,
        b"give" => Cmd::Give,
        _ if line.strip_prefix(b"stop ") == Some(session.as_bytes()) => Cmd::Stop,
        _ if line.starts_with(b"stop ") => {
            let _ = (&stream)
                .write_all(format!("error this keeper holds session {session}\n").as_bytes());
            return None;
        }
        _ => {
            let _ = (&stream).write_all(b"error unknown command\n");
            return None;
        }
    };
    let reply = format!("ok {session}\n");
    let fds = [dev];
    let sent = if cmd == Cmd::Give {
        send_with_fd(&stream, reply.as_bytes(), &fds)
    } else {
        (&stream).write_all(reply.as_bytes())
    };
    sent.ok()?;
    Some(cmd)
}

fn send_with_fd(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("no room for the descriptor"));
    }
    let n = rustix::net::sendmsg(
        stream,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::empty(),
    )?;
    if n != bytes.len() {
        return Err(io::Error::other("the answer was cut short"));
    }
    Ok(())
}

/// One answer line, and the descriptor that came with it, if any.
fn recv_line(stream: &UnixStream) -> io::Result<(String, Option<OwnedFd>)> {
    let mut buf = [0u8; MAX_LINE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fd = None;
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = msg {
            for f in fds {
                // Keep the first; any other closes here.
                fd.get_or_insert(f);
            }
        }
    }
    let text = String::from_utf8_lossy(&buf[..got.bytes]);
    let line = text.split('\n').next().unwrap_or_default().to_string();
    Ok((line, fd))
}

/// The session of an `ok SESSION` answer.
fn parse_ok(line: &str) -> io::Result<String> {
    match line.strip_prefix("ok ") {
        Some(session) if !session.is_empty() => Ok(session.to_string()),
        _ => Err(io::Error::other(format!("the keeper answered {line:?}"))),
    }
}

#[cfg(test)]
mod tests;
