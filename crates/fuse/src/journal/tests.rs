//! The log's records round trip, a torn tail is left out, and compaction
//! keeps exactly what is live.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::*;
use crate::inodes::Inodes;

fn unix(uid: u32, gid: u32, gids: &[u32]) -> Credentials {
    Credentials::Unix(AuthUnix {
        stamp: 0,
        machine: MACHINE.to_vec(),
        uid,
        gid,
        gids: gids.to_vec(),
    })
}

const SPARE: u64 = 1 << 63;

/// Writes one record of every kind and returns the table they leave.
fn write_every_kind(j: &Journal) -> Table {
    j.node(10, 1, b"file a").unwrap();
    j.node(10, 2, &[]).unwrap();
    j.node(SPARE + 1, 1, &[7; MAX_FH]).unwrap();
    j.node(11, 1, b"gone").unwrap();
    j.forget(11, 1).unwrap();
    j.forget(10, 1).unwrap();
    let many: Vec<u32> = (100..100 + MAX_GIDS as u32).collect();
    j.open(1, 10, &unix(1000, 100, &many)).unwrap();
    j.open(2, SPARE + 1, &Credentials::None).unwrap();
    j.open(3, 10, &unix(0, 0, &[])).unwrap();
    j.release(3).unwrap();
    let name = vec![b'n'; NAME_MAX];
    j.hidden(10, b"dir", &name, &unix(1000, 100, &[4])).unwrap();
    j.hidden(12, b"dir", b".gvfs-fuse2", &unix(0, 0, &[]))
        .unwrap();
    j.unhidden(12).unwrap();
    let mut t = Table {
        generation: 1,
        ..Table::default()
    };
    t.nodes.insert(
        10,
        NodeEntry {
            fh: b"file a".to_vec(),
            lookups: 2,
        },
    );
    t.nodes.insert(
        SPARE + 1,
        NodeEntry {
            fh: vec![7; MAX_FH],
            lookups: 1,
        },
    );
    t.opens.insert(
        1,
        OpenEntry {
            ino: 10,
            cred: unix(1000, 100, &many),
        },
    );
    t.opens.insert(
        2,
        OpenEntry {
            ino: SPARE + 1,
            cred: Credentials::None,
        },
    );
    t.hidden.insert(
        10,
        HiddenEntry {
            dir: b"dir".to_vec(),
            name,
            cred: unix(1000, 100, &[4]),
        },
    );
    t
}

/// `t` without what says where replay stopped.
fn live(t: &Table) -> Table {
    Table {
        len: 0,
        torn: false,
        ..t.clone()
    }
}

#[test]
fn every_kind_of_record_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::create(dir.path()).unwrap();
    let want = write_every_kind(&j);
    let got = replay(&j.path()).unwrap();
    assert!(!got.torn);
    assert_eq!(got.len, j.len());
    assert_eq!(live(&got), want);
    // Handles and names past their bounds are refused, not cut.
    assert!(j.node(13, 1, &[1; MAX_FH + 1]).is_err());
    assert!(
        j.hidden(13, b"d", &[b'x'; NAME_MAX + 1], &Credentials::None)
            .is_err()
    );
    assert_eq!(live(&replay(&j.path()).unwrap()), want);
}

#[test]
fn a_torn_or_bad_tail_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::create(dir.path()).unwrap();
    j.node(10, 1, b"a").unwrap();
    let before = j.len();
    j.node(11, 1, b"b").unwrap();
    let whole = j.len();
    let path = j.path();

    // Cut in the middle of the last record: it is gone, the rest stays.
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(whole - 3).unwrap();
    let t = replay(&path).unwrap();
    assert!(t.torn);
    assert_eq!(t.len, before);
    assert!(t.nodes.contains_key(&10));
    assert!(!t.nodes.contains_key(&11));

    // A whole record with a bad CRC, and whatever follows it.
    f.set_len(whole).unwrap();
    let flip = before + 4;
    let mut b = [0_u8; 1];
    File::open(&path)
        .unwrap()
        .read_exact_at(&mut b, flip)
        .unwrap();
    f.write_all_at(&[b[0] ^ 0x40], flip).unwrap();
    let t = replay(&path).unwrap();
    assert!(t.torn);
    assert_eq!(t.len, before);
    assert!(!t.nodes.contains_key(&11));

    // A length past any record's: not read as one.
    f.write_all_at(&u16::MAX.to_le_bytes(), before).unwrap();
    let t = replay(&path).unwrap();
    assert!(t.torn && t.nodes.contains_key(&10) && t.nodes.len() == 1);

    // Resuming drops the tail: appends after it are read again.
    let j = Journal::resume(dir.path(), &t).unwrap();
    j.node(12, 1, b"c").unwrap();
    let t = replay(&path).unwrap();
    assert!(!t.torn);
    assert_eq!(t.generation, 2);
    let mut ids: Vec<u64> = t.nodes.keys().copied().collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![10, 12]);
}

#[test]
fn a_record_of_an_unknown_kind_stops_replay() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::create(dir.path()).unwrap();
    j.node(10, 1, b"a").unwrap();
    let mut r = Record::new(42);
    r.u64(1);
    (&j.inner.lock().unwrap().file)
        .write_all(r.finish())
        .unwrap();
    j.node(11, 1, b"b").unwrap();
    let t = replay(&j.path()).unwrap();
    assert!(t.torn);
    assert_eq!(t.nodes.len(), 1);
}

#[test]
fn compaction_keeps_exactly_what_is_live_and_bounds_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let min = 4096;
    let j = Arc::new(Journal::with_min_compact(dir.path(), min).unwrap());
    let mut inodes = Inodes::new(b"root", 2);
    inodes.set_journal(Some(j.clone()));
    let mut opens: HashMap<u64, OpenEntry> = HashMap::new();
    let mut hidden: HashMap<u64, HiddenEntry> = HashMap::new();
    let mut compactions = 0;
    for i in 0..5000_u64 {
        // Nodes come and go; every seventh stays, with two lookups.
        let fh = format!("fh{i}").into_bytes();
        let ino = inodes.remember(&fh, 1000 + i).unwrap();
        if i % 7 == 0 {
            inodes.remember(&fh, 1000 + i).unwrap();
        } else {
            inodes.forget(ino, 1);
        }
        if i % 50 == 0 {
            let cred = unix(i as u32, 0, &[]);
            j.open(i, ino, &cred).unwrap();
            opens.insert(i, OpenEntry { ino, cred });
        }
        if i % 100 == 0 {
            j.release(i).unwrap();
            opens.remove(&i);
            let h = HiddenEntry {
                dir: b"d".to_vec(),
                name: format!(".gvfs-fuse{i:016x}").into_bytes(),
                cred: Credentials::None,
            };
            j.hidden(ino, &h.dir, &h.name, &h.cred).unwrap();
            hidden.insert(ino, h);
        }
        if i % 300 == 0 {
            let gone = *hidden.keys().next().unwrap();
            j.unhidden(gone).unwrap();
            hidden.remove(&gone);
        }
        // Bounded: past its bound by an iteration's records at most.
        let base = lock(&j.inner).base;
        assert!(j.len() <= min.max(4 * base) + 8 * MAX_RECORD as u64);
        if j.due() {
            compactions += 1;
            j.compact(|s| {
                inodes.snapshot(s)?;
                for (h, o) in &opens {
                    s.open(*h, o.ino, &o.cred)?;
                }
                for (ino, h) in &hidden {
                    s.hidden(*ino, &h.dir, &h.name, &h.cred)?;
                }
                Ok(())
            })
            .unwrap();
            assert!(!j.due());
        }
    }
    assert!(compactions > 2, "{compactions} compactions");
    let t = replay(&j.path()).unwrap();
    assert!(!t.torn);
    assert_eq!(t.generation, 1 + compactions);
    assert!(!dir.path().join(NEW).exists());
    // Exactly the live state.
    assert_eq!(t.nodes.len() + 1, inodes.len(), "every node but the root");
    for (ino, n) in &t.nodes {
        assert_eq!(inodes.handle(*ino).as_deref(), Some(n.fh.as_slice()));
        assert_eq!(n.lookups, 2);
    }
    assert_eq!(t.opens, opens);
    assert_eq!(t.hidden, hidden);
}

#[test]
fn a_write_that_fails_breaks_nothing_already_written() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::create(dir.path()).unwrap();
    j.node(10, 1, b"a").unwrap();
    j.sabotage();
    assert!(j.node(11, 1, b"b").is_err());
    assert!(j.open(1, 10, &Credentials::None).is_err());
    let t = replay(&j.path()).unwrap();
    assert!(!t.torn);
    assert_eq!(t.nodes.len(), 1);
}
