use super::*;
use crate::tests::attrs;

const C: u64 = CHUNK as u64;
const P: u64 = PIECE as u64;

/// The bytes of a file of `len` bytes, told apart piece by piece.
fn bytes(len: u64) -> Vec<u8> {
    (0..len).map(|i| (i / 7 + i / P) as u8).collect()
}

/// A log in a fresh directory for a file of `size` bytes.
fn fresh(size: u64) -> (tempfile::TempDir, PathBuf, Progress) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("f.progress");
    let log = Progress::create(&path, &attrs(size, 7)).unwrap_or_else(|e| panic!("{e}"));
    (dir, path, log)
}

fn note(log: &mut Progress, data: &[u8], from: u64, to: u64) {
    log.note(from, &data[from as usize..to as usize])
        .unwrap_or_else(|e| panic!("{e}"));
}

fn load(path: &Path) -> Progress {
    Progress::load(path, 1 << 40).unwrap_or_else(|e| panic!("{e}"))
}

fn masks(log: &Progress) -> Vec<(usize, Mask)> {
    log.masks().collect()
}

#[test]
fn a_log_round_trips() {
    // Three chunks and a last one of 5000 bytes: one short piece.
    let size = 3 * C + 5000;
    let data = bytes(size);
    let (_dir, path, mut log) = fresh(size);
    note(&mut log, &data, 0, C);
    note(&mut log, &data, C + 3 * P, C + 6 * P);
    note(&mut log, &data, 3 * C, size);
    // A range not on pieces records only the pieces it holds whole.
    note(&mut log, &data, 2 * C + 100, 2 * C + 3 * P + 100);
    let want = vec![(0, Mask::MAX), (1, 0b111 << 3), (2, 0b110), (3, 1)];
    assert_eq!(masks(&log), want);
    let back = load(&path);
    assert_eq!(masks(&back), want);
    assert_eq!(back.log_len(), log.log_len());
    for (idx, _) in &want {
        assert_eq!(back.logged(*idx), log.logged(*idx), "chunk {idx}");
    }
    assert_eq!(back.recorded_bytes(), C + 3 * P + 2 * P + 5000);
    assert_eq!(back.size(), size);
    assert_eq!(back.attrs().mtime.seconds, 7);
    // Its CRCs are the bytes'.
    let l = back.logged(1).unwrap_or_else(|| panic!("chunk 1"));
    let at = (C + 4 * P) as usize;
    assert_eq!(l.crcs[4], crc32fast::hash(&data[at..at + P as usize]));
}

#[test]
fn replay_stops_at_a_torn_or_bad_record_and_goes_on_after_it() {
    let size = 4 * C;
    let data = bytes(size);
    let (_dir, path, mut log) = fresh(size);
    note(&mut log, &data, 0, 2 * P);
    let one = log.log_len();
    note(&mut log, &data, C, C + 2 * P);
    let two = log.log_len();
    note(&mut log, &data, 2 * C, 2 * C + P);
    drop(log);
    // Torn: the last record cut short.
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{e}"));
    f.set_len(two + 5).unwrap_or_else(|e| panic!("{e}"));
    let mut back = load(&path);
    assert_eq!(masks(&back), vec![(0, 0b11), (1, 0b11)]);
    // Cut at the last good record: what comes next is read again.
    assert_eq!(std::fs::metadata(&path).map(|m| m.len()).ok(), Some(two));
    note(&mut back, &data, 3 * C, 3 * C + P);
    drop(back);
    assert_eq!(masks(&load(&path)), vec![(0, 0b11), (1, 0b11), (3, 1)]);
    // A bad record in the middle: what follows it is lost too.
    f.write_all_at(&[0xff], one + 22)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(masks(&load(&path)), vec![(0, 0b11)]);
    // A record naming pieces past the file's end is bad.
    let (_dir, path, mut log) = fresh(C + P);
    let mut rec = Vec::new();
    put_record(&mut rec, 1, 0b11, &[1, 2]);
    log.file.write_all(&rec).unwrap_or_else(|e| panic!("{e}"));
    let mut rec = Vec::new();
    put_record(&mut rec, 2, 0b1, &[1]);
    log.file.write_all(&rec).unwrap_or_else(|e| panic!("{e}"));
    drop(log);
    assert!(masks(&load(&path)).is_empty());
}

#[test]
fn a_log_is_compacted_past_its_bound() {
    let size = 2 * C;
    let data = bytes(size);
    let (_dir, path, mut log) = fresh(size);
    let most = bound(size);
    // The same pieces written again and again (a fetch retried).
    for round in 0..200 {
        let at = (round % 128) * P;
        note(&mut log, &data, at, at + P);
        note(&mut log, &data, C + at, C + at + P);
        assert!(log.log_len() <= most, "{} > {most}", log.log_len());
    }
    let back = load(&path);
    assert_eq!(masks(&back), vec![(0, Mask::MAX), (1, Mask::MAX)]);
    assert_eq!(back.logged(1), log.logged(1));
    // Compacted: a header and a record per chunk.
    let mut once = fresh(size).2;
    note(&mut once, &data, 0, C);
    note(&mut once, &data, C, 2 * C);
    let mut compacted = back;
    compacted.compact().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(compacted.log_len(), once.log_len());
    assert!(!path.with_extension("progress.new").exists());
}

#[test]
fn a_hole_where_a_recorded_piece_was_fails_its_crc() {
    let size = C + 3000;
    let data = bytes(size);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("f");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{e}"));
    file.set_len(size).unwrap_or_else(|e| panic!("{e}"));
    let mut log =
        Progress::create(&progress_of(&path), &attrs(size, 7)).unwrap_or_else(|e| panic!("{e}"));
    for (from, to) in [(0, 4 * P), (C, size)] {
        file.write_all_at(&data[from as usize..to as usize], from)
            .unwrap_or_else(|e| panic!("{e}"));
        note(&mut log, &data, from, to);
    }
    let check = |idx: usize, mask: Mask| {
        let logged = log.logged(idx).cloned().unwrap_or_default();
        check_pieces(&file, size, idx, mask, &logged).unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(check(0, 0b1111), 0b1111);
    // The last piece, short, checks too; a piece never recorded fails.
    assert_eq!(check(1, 1), 1);
    assert_eq!(check(0, 0b11_0000), 0);
    // A byte changed fails its piece only.
    file.write_all_at(&[data[P as usize + 9] ^ 1], P + 9)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(check(0, 0b1111), 0b1101);
    // A hole (the data lost, a reboot before it reached the disk).
    file.set_len(0).unwrap_or_else(|e| panic!("{e}"));
    file.set_len(size).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(check(0, 0b1111), 0);
    assert_eq!(check(1, 1), 0);
}

fn progress_of(path: &Path) -> PathBuf {
    crate::names::progress_path(path)
}

#[test]
fn a_bad_header_or_an_overlong_log_is_refused_without_panicking() {
    let size = 2 * C;
    let data = bytes(size);
    let (_dir, path, mut log) = fresh(size);
    note(&mut log, &data, 0, C);
    note(&mut log, &data, C, C + 5 * P);
    drop(log);
    let good = std::fs::read(&path).unwrap_or_else(|e| panic!("{e}"));
    let try_load = |bytes: &[u8], max: u64| {
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
        Progress::load(&path, max)
    };
    // Every prefix loads or is refused; none panics.
    for len in 0..good.len() {
        let r = try_load(&good[..len], 1 << 40);
        assert_eq!(r.is_ok(), len >= HEADER_LEN, "{len} bytes");
    }
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(matches!(
        try_load(&bad, 1 << 40),
        Err(ProgressError::BadMagic)
    ));
    let mut bad = good.clone();
    bad[4] = 2;
    assert!(matches!(
        try_load(&bad, 1 << 40),
        Err(ProgressError::Version(2))
    ));
    let mut bad = good.clone();
    bad[40] ^= 1;
    assert!(matches!(
        try_load(&bad, 1 << 40),
        Err(ProgressError::Checksum)
    ));
    assert!(matches!(
        try_load(&good, size - 1),
        Err(ProgressError::TooLarge { .. })
    ));
    let mut long = good.clone();
    long.resize(bound(size) as usize + MAX_RECORD + 1, 0);
    assert!(matches!(
        try_load(&long, 1 << 40),
        Err(ProgressError::TooLong { .. })
    ));
    // A header whose size is not its attributes'.
    let mut other = header(&attrs(size, 7));
    other[8..16].copy_from_slice(&(size + 1).to_le_bytes());
    let crc = crc32fast::hash(&other[..HEADER_LEN - 4]);
    other[HEADER_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        try_load(&other, 1 << 40),
        Err(ProgressError::SizeMismatch { .. })
    ));
}
