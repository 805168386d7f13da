//! Who is calling: the AUTH_UNIX credentials of the process behind a
//! FUSE request.
//!
//! FUSE tells the caller's uid, gid and pid, not its supplementary
//! groups; those are read from `/proc/PID/status` (`Groups:`), at most
//! [`MAX_GIDS`] of them as AUTH_UNIX allows, and remembered for a second
//! per process so that a stream of calls does not read it each time. A
//! process that is gone (or a kernel thread, pid 0) is sent with its uid
//! and gid alone.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gvfs_nfs::layer::lock;
use gvfs_nfs::rpc::{AuthUnix, MAX_GIDS};
use gvfs_nfs::{CallContext, Credentials};

/// How long a process's groups are remembered.
const TTL: Duration = Duration::from_secs(1);
/// Most processes remembered.
const MAX_PROCESSES: usize = 4096;

/// When a process's groups were read, for which uid, and what they were.
type Known = (Instant, u32, Vec<u32>);

/// Remembered groups, per pid.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    known: Mutex<HashMap<u32, Known>>,
}

impl Groups {
    /// The call context of a request from `uid`/`gid`, process `pid`.
    pub(crate) fn context(&self, uid: u32, gid: u32, pid: u32) -> CallContext {
        let gids = self.of(uid, pid);
        CallContext::with_cred(Credentials::Unix(AuthUnix {
            stamp: 0,
            machine: b"gvfs-fuse".to_vec(),
            uid,
            gid,
            gids,
        }))
    }

    /// The supplementary groups of process `pid` (running as `uid`).
    fn of(&self, uid: u32, pid: u32) -> Vec<u32> {
        if pid == 0 {
            return Vec::new();
        }
        let now = Instant::now();
        {
            let known = lock(&self.known);
            if let Some((at, who, gids)) = known.get(&pid)
                && now.duration_since(*at) < TTL
                && *who == uid
            {
                return gids.clone();
            }
        }
        let gids = read_groups(pid).unwrap_or_default();
        let mut known = lock(&self.known);
        if known.len() >= MAX_PROCESSES {
            known.retain(|_, (at, _, _)| now.duration_since(*at) < TTL);
            if known.len() >= MAX_PROCESSES {
                known.clear();
            }
        }
        known.insert(pid, (now, uid, gids.clone()));
        gids
    }
}

/// The `Groups:` line of `/proc/PID/status`, at most [`MAX_GIDS`].
fn read_groups(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    Some(parse_groups(line))
}

fn parse_groups(line: &str) -> Vec<u32> {
    line.split_whitespace()
        .filter_map(|g| g.parse().ok())
        .take(MAX_GIDS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_read_from_proc_and_capped() {
        assert_eq!(parse_groups(" 4 24 27\t100 "), vec![4, 24, 27, 100]);
        let many: String = (0..40).map(|g| format!("{g} ")).collect();
        assert_eq!(parse_groups(&many).len(), MAX_GIDS);
        let me = std::process::id();
        let mine = read_groups(me).expect("this process has a status file");
        let cx = Groups::default().context(0, 0, me);
        match cx.cred {
            Credentials::Unix(u) => assert_eq!(u.gids, mine),
            other => panic!("{other:?}"),
        }
    }
}
