//! Listings on the FUSE mount (`gvfs-proxy --mount DIR`): READDIRPLUS
//! hands the kernel every entry's attributes and node, and every node is
//! forgotten again when the kernel drops its inodes.
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; the tests run as root, as the CI does.

use std::fs;
use std::thread;
use std::time::Duration;

use anyhow::{Result, ensure};
use gvfs_testbed::ProxyArgs;
use gvfs_testbed::fuse::{MountPoint, drop_caches, mounted};
use gvfs_testbed::require_fuse;

/// A listing hands the kernel every entry's attributes and node
/// (READDIRPLUS): `ls -l` of 1,000 files needs no LOOKUP per name, and
/// every node it handed out is forgotten again when the kernel drops its
/// inodes (no node kept too long, none dropped too early: each file still
/// reads right after).
#[test]
fn listings_carry_attributes_and_every_node_is_forgotten() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let dir = origin.path().join("many");
    fs::create_dir(&dir)?;
    for i in 0..1000 {
        fs::write(
            dir.join(format!("entry-with-a-longer-name-{i:04}")),
            i.to_string(),
        )?;
    }
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    let baseline = p.stats()?.mount()?.inodes;
    let calls = p.stats()?.mount()?.counts.calls;
    let listed = mnt.path().join("many");
    let mut sizes = 0;
    for e in fs::read_dir(&listed)? {
        let e = e?;
        sizes += e.metadata()?.len();
    }
    let expected: u64 = (0..1000).map(|i: u64| i.to_string().len() as u64).sum();
    ensure!(
        sizes == expected,
        "sizes listed {sizes}, expected {expected}"
    );
    let spent = p.stats()?.mount()?.counts.calls - calls;
    ensure!(
        spent < 100,
        "listing and stat-ing 1,000 names took {spent} calls: a LOOKUP per name"
    );
    ensure!(
        p.stats()?.mount()?.inodes >= baseline + 1000,
        "the listing handed out no nodes"
    );
    // The kernel drops its dentries and inodes: it forgets every node.
    let mut left = u64::MAX;
    for _ in 0..50 {
        drop_caches();
        left = p.stats()?.mount()?.inodes;
        if left <= baseline + 1 {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        left <= baseline + 1,
        "{left} nodes left after the kernel dropped its inodes (from {baseline}): some never forgotten"
    );
    for i in [0, 517, 999] {
        let got = fs::read_to_string(listed.join(format!("entry-with-a-longer-name-{i:04}")))?;
        ensure!(got == i.to_string(), "entry {i} reads {got:?}");
    }
    Ok(())
}
