//! The session file round trips and is checked; the lock excludes a
//! second holder until the first lets go.

use super::*;

fn header() -> Header {
    let mut h = Header::new((0, 57), b"root handle", 2, Path::new("/mnt/vm"));
    h.set_resend(true);
    h
}

fn expected(h: &Header) -> Expected<'_> {
    Expected {
        id: Some(h.id),
        dev: h.dev,
        root_fh: &h.root_fh,
        dir: &h.dir,
    }
}

#[test]
fn the_session_file_round_trips() {
    let h = header();
    assert!(h.resend());
    let b = h.encode().unwrap();
    assert_eq!(&b[..4], b"GVFS");
    assert_eq!(b.len(), FIXED + h.root_fh.len() + "/mnt/vm".len());
    assert_eq!(Header::decode(&b), Ok(h.clone()));
    assert_ne!(header().id, h.id, "ids are random");

    let dir = tempfile::tempdir().unwrap();
    let s = SessionState::create(&dir.path().join("state")).unwrap();
    s.write_header(&h).unwrap();
    assert_eq!(s.read_header().unwrap(), h);
    assert_eq!(s.check_header(&expected(&h)).unwrap(), h);
    let mode = std::fs::metadata(s.dir()).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o700);
    s.clear();
    assert!(matches!(s.read_header(), Err(FuseError::State { .. })));
    assert!(!s.dir().exists(), "nothing left");
}

#[test]
fn a_damaged_session_file_is_refused() {
    let b = header().encode().unwrap();
    assert_eq!(Header::decode(&b[..10]), Err(SessionProblem::Short));
    let mut long = b.clone();
    long.resize(MAX_SESSION + 1, 0);
    assert_eq!(Header::decode(&long), Err(SessionProblem::Long));
    let mut bad = b.clone();
    bad[0] = b'X';
    assert_eq!(Header::decode(&bad), Err(SessionProblem::Magic));
    let mut bad = b.clone();
    bad[4] = 2;
    assert_eq!(Header::decode(&bad), Err(SessionProblem::Version(2)));
    let mut bad = b.clone();
    bad[30] ^= 1;
    assert_eq!(Header::decode(&bad), Err(SessionProblem::Crc));
    // A root fh length past 64, with a CRC that matches.
    let mut bad = b[..b.len() - 4].to_vec();
    bad[48..52].copy_from_slice(&65_u32.to_le_bytes());
    let crc = crc32fast::hash(&bad);
    bad.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(Header::decode(&bad), Err(SessionProblem::Length));
    // A root fh the format cannot hold is not written.
    let mut h = header();
    h.root_fh = vec![0; MAX_FH + 1];
    assert_eq!(h.encode(), None);
}

#[test]
fn another_session_is_refused() {
    let h = header();
    assert_eq!(h.differs_from(&expected(&h)), None);
    let other_id = [9; 16];
    let cases: [(Expected<'_>, &str); 4] = [
        (
            Expected {
                id: Some(other_id),
                ..expected(&h)
            },
            "session id",
        ),
        (
            Expected {
                dev: (0, 58),
                ..expected(&h)
            },
            "device (MAJ:MIN)",
        ),
        (
            Expected {
                root_fh: b"another root",
                ..expected(&h)
            },
            "root file handle",
        ),
        (
            Expected {
                dir: Path::new("/mnt/other"),
                ..expected(&h)
            },
            "mount directory",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let s = SessionState::create(dir.path()).unwrap();
    s.write_header(&h).unwrap();
    for (want, what) in cases {
        assert_eq!(h.differs_from(&want), Some(what));
        assert!(matches!(
            s.check_header(&want),
            Err(FuseError::DifferentSession { what: w, .. }) if w == what
        ));
    }
    // Without an id to match, the rest still must.
    let no_id = Expected {
        id: None,
        ..expected(&h)
    };
    assert!(s.check_header(&no_id).is_ok());
}

#[test]
fn the_lock_is_held_until_its_holder_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let first = SessionState::create(dir.path()).unwrap();
    let pid = std::process::id();
    assert!(matches!(
        SessionState::create(dir.path()),
        Err(FuseError::StateBusy { pid: Some(p), .. }) if p == pid
    ));
    assert!(SessionState::try_lock(dir.path()).unwrap().is_none());
    let start = Instant::now();
    assert!(
        SessionState::lock_within(dir.path(), Duration::from_millis(50))
            .unwrap()
            .is_none()
    );
    assert!(start.elapsed() >= Duration::from_millis(50));
    let waiter = {
        let dir = dir.path().to_path_buf();
        std::thread::spawn(move || SessionState::open_existing(&dir, Duration::from_secs(30)))
    };
    std::thread::sleep(Duration::from_millis(30));
    drop(first);
    assert!(waiter.join().unwrap().is_ok(), "taken once let go");
}

#[test]
fn a_state_directory_of_someone_else_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        SessionState::create(&file),
        Err(FuseError::State { .. })
    ));
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(dir.path(), &link).unwrap();
    assert!(matches!(
        SessionState::open_existing(&link, Duration::ZERO),
        Err(FuseError::State { .. })
    ));
}
