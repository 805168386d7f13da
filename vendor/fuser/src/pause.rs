// gvfs patch: this whole file is new (see PATCHED.md).
//! Stopping a session's readers without ending the FUSE connection.
//!
//! A reader blocks in `read(2)` on the FUSE device. To stop it without
//! closing or unmounting anything, [`BackgroundSession::pause`] sets a shared
//! flag and interrupts each reader with a signal whose handler does nothing
//! and is installed without `SA_RESTART`, so the blocking `read(2)` returns
//! EINTR; the reader then sees the flag and returns. The signal is sent again
//! every 10 ms, which covers one that lands just before the reader enters
//! `read(2)`.
//!
//! [`BackgroundSession::pause`]: crate::BackgroundSession::pause

use std::io;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;

use parking_lot::Mutex;

/// How often [`Readers::pause`] signals the readers still running.
const RESIGNAL_EVERY: Duration = Duration::from_millis(10);

/// The readers of one session, as [`Readers::pause`] needs them.
#[derive(Debug, Default)]
pub(crate) struct Readers {
    /// Set once by `pause`: no reader starts another `read(2)` after it.
    stop: AtomicBool,
    /// The readers still running.
    running: Mutex<Vec<Arc<Reader>>>,
}

/// One reader thread.
#[derive(Debug)]
struct Reader {
    thread: libc::pthread_t,
    /// Set while the reader is in (or about to enter) `read(2)`; a reader
    /// busy dispatching is not signalled, so the filesystem's own system
    /// calls never see EINTR from a pause.
    reading: AtomicBool,
}

/// A registered reader; dropping it (the reader's thread returning, or
/// unwinding) takes it off the list before its thread ends.
#[derive(Debug)]
pub(crate) struct ReaderGuard {
    readers: Arc<Readers>,
    me: Arc<Reader>,
}

impl Readers {
    /// Registers the calling thread as a reader, and unblocks the signal
    /// in it (a thread inherits its creator's signal mask).
    pub(crate) fn register(self: &Arc<Self>) -> ReaderGuard {
        // SAFETY: the set is initialized by sigemptyset before use; the
        // old mask is not asked for.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, wakeup_signal());
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        }
        let me = Arc::new(Reader {
            // SAFETY: pthread_self has no preconditions.
            thread: unsafe { libc::pthread_self() },
            reading: AtomicBool::new(false),
        });
        self.running.lock().push(me.clone());
        ReaderGuard {
            readers: self.clone(),
            me,
        }
    }

    /// Sets the stop flag, then signals every reader in `read(2)` every
    /// 10 ms until `session` (the thread that runs the readers and joins
    /// them) has ended and no reader is left, or `within` has passed.
    pub(crate) fn pause(
        &self,
        session: &JoinHandle<io::Result<()>>,
        within: Duration,
    ) -> io::Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        let signal = wakeup_signal();
        install_noop_handler(signal)?;
        let deadline = Instant::now() + within;
        loop {
            {
                // Signals are sent with the list locked: a reader leaves the
                // list (under this lock) before its thread ends, so every
                // pthread_t signalled belongs to a live thread.
                let running = self.running.lock();
                if running.is_empty() && session.is_finished() {
                    return Ok(());
                }
                for reader in running.iter() {
                    if reader.reading.load(Ordering::SeqCst) {
                        // SAFETY: the thread is alive (see above); the
                        // signal has a handler, so it cannot kill the process.
                        unsafe {
                            libc::pthread_kill(reader.thread, signal);
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("FUSE session readers still running after {within:?}"),
                ));
            }
            std::thread::sleep(RESIGNAL_EVERY);
        }
    }
}

impl ReaderGuard {
    /// Call right before `read(2)`: false once the session is pausing, and
    /// then nothing more may be read.
    pub(crate) fn may_read(&self) -> bool {
        // The flag is set before `stop` is checked, and `pause` sets `stop`
        // before it checks the flag: one of the two sees the other.
        self.me.reading.store(true, Ordering::SeqCst);
        !self.readers.stop.load(Ordering::SeqCst)
    }

    /// Call once `read(2)` has returned.
    pub(crate) fn done_reading(&self) {
        self.me.reading.store(false, Ordering::SeqCst);
    }
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        let mut running = self.readers.running.lock();
        running.retain(|r| !Arc::ptr_eq(r, &self.me));
    }
}

/// The signal that interrupts a reader: SIGRTMIN+5, a real-time signal no
/// default handler and no common runtime uses.
fn wakeup_signal() -> libc::c_int {
    libc::SIGRTMIN() + 5
}

extern "C" fn noop(_: libc::c_int) {}

/// Installs a handler that does nothing, without `SA_RESTART`, so a
/// blocking `read(2)` the signal lands in returns EINTR.
fn install_noop_handler(signal: libc::c_int) -> io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value;
    // the handler is async-signal-safe (it does nothing).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = noop as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = 0;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
