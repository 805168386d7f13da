//! systemd's side of sd_notify(3), faked for a test: a datagram socket a
//! proxy is pointed at with `NOTIFY_SOCKET` (and `FDSTORE`, the size of
//! its file descriptor store), which receives its messages and the
//! descriptors sent with them (`FDSTORE=1` and SCM_RIGHTS). What a test
//! keeps of those is "systemd's store"; it gives them to the next proxy
//! with [`ProxyArgs::pass_fd`].

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

use crate::proxy::ProxyArgs;

/// The longest message read.
const MAX_MESSAGE: usize = 4096;

/// A fake service manager's notification socket.
pub struct FakeSystemd {
    socket: UnixDatagram,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

/// One message a proxy sent.
#[derive(Debug)]
pub struct Notice {
    /// Its text: `KEY=VALUE` lines.
    pub text: String,
    /// The descriptors sent with it.
    pub fds: Vec<OwnedFd>,
}

impl Notice {
    /// The value of `key`, if the message has it.
    pub fn value(&self, key: &str) -> Option<&str> {
        self.text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
    }
}

impl FakeSystemd {
    /// A socket in a directory of its own.
    pub fn bind() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).context("binding the notify socket")?;
        Ok(Self {
            socket,
            path,
            _dir: dir,
        })
    }

    /// Its path, for `NOTIFY_SOCKET`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `args` with this socket as `NOTIFY_SOCKET` and a store of
    /// `fd_store_max` descriptors (`FDSTORE`, as
    /// `FileDescriptorStoreMax=` sets it).
    pub fn args(&self, args: ProxyArgs, fd_store_max: u32) -> ProxyArgs {
        args.env("NOTIFY_SOCKET", self.path.display().to_string())
            .env("FDSTORE", fd_store_max.to_string())
    }

    /// The next message, within `within`.
    pub fn next(&self, within: Duration) -> Result<Notice> {
        self.socket.set_read_timeout(Some(within))?;
        let mut buf = [0u8; MAX_MESSAGE];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            &self.socket,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
        .with_context(|| format!("no message on the notify socket within {within:?}"))?;
        let mut fds = Vec::new();
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(passed) = msg {
                fds.extend(passed);
            }
        }
        Ok(Notice {
            text: String::from_utf8_lossy(&buf[..got.bytes]).into_owned(),
            fds,
        })
    }

    /// The first message `want` holds of within `within`; those before it
    /// are dropped (with their descriptors).
    pub fn wait_for(&self, within: Duration, want: impl Fn(&Notice) -> bool) -> Result<Notice> {
        let until = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("no such message within {within:?}; got {seen:?}");
            }
            let notice = self
                .next(left)
                .with_context(|| format!("messages before: {seen:?}"))?;
            if want(&notice) {
                return Ok(notice);
            }
            seen.push(notice.text);
        }
    }
}
