use super::*;
use crate::hashes::piece_hash;
use proptest::prelude::*;

fn sample() -> MetaFile {
    let mut zero = ZeroMap::new(10);
    zero.set_zero(0);
    zero.set_zero_range(3, 6);
    zero.set_zero(9);
    MetaFile {
        block_size: 4096,
        file_size: 9 * 4096 + 100,
        mtime: (1_700_000_000, 123_456_789),
        ctime: (1_700_000_001, 5),
        actions: Actions::COMPRESS_AND_COPY,
        compressed_size: 777,
        zero,
        repeats: Vec::new(),
        hashes: None,
    }
}

/// A ZeroMap from a bool-per-block model.
fn from_bits(bits: &[bool]) -> ZeroMap {
    let mut m = ZeroMap::new(bits.len() as u64);
    for (i, &z) in bits.iter().enumerate() {
        if z {
            m.set_zero(i as u64);
        }
    }
    m
}

fn arb_meta() -> impl Strategy<Value = MetaFile> {
    (
        12u32..=20,
        prop::collection::vec(any::<bool>(), 0..300),
        any::<u64>(),
        (any::<u64>(), 0u32..1_000_000_000),
        (any::<u64>(), 0u32..1_000_000_000),
        0u32..16,
        any::<u64>(),
    )
        .prop_flat_map(|(shift, bits, seed, mtime, ctime, acts, csize)| {
            let bs = 1u32 << shift;
            let blocks = bits.len() as u64;
            // Any size whose block count is `blocks`.
            let size = if blocks == 0 {
                0
            } else {
                (blocks - 1) * u64::from(bs) + 1 + seed % u64::from(bs)
            };
            Just(MetaFile {
                block_size: bs,
                file_size: size,
                mtime,
                ctime,
                actions: Actions::from_bits(acts).unwrap_or_default(),
                compressed_size: csize,
                zero: from_bits(&bits),
                repeats: Vec::new(),
                hashes: None,
            })
        })
}

#[test]
fn repeats_round_trip_as_version_2_and_clip_to_ranges() {
    let mut m = sample();
    assert_eq!(
        m.encode()[8..12],
        META_VERSION.to_le_bytes(),
        "no repeats: version 1"
    );
    m.repeats = vec![
        Repeat {
            to: 2,
            from: 1,
            len: 1,
        },
        Repeat {
            to: 6,
            from: 1,
            len: 2,
        },
    ];
    m.validate().unwrap_or_else(|e| panic!("{e}"));
    let b = m.encode();
    assert_eq!(b.len(), m.encoded_len());
    assert_eq!(b[8..12], META_VERSION_REPEATS.to_le_bytes());
    assert_eq!(MetaFile::decode(&b).unwrap_or_else(|e| panic!("{e}")), m);
    assert_eq!(m.repeat_bytes(), 3 * 4096);
    // Blocks 6..8 repeat 1..3: the bytes 7*4096-100.. of them, clipped.
    assert_eq!(
        m.repeats_in(7 * 4096 - 100, 1000),
        vec![ByteRepeat {
            to: 7 * 4096 - 100,
            from: 2 * 4096 - 100,
            len: 1000
        }]
    );
    assert_eq!(
        m.repeats_in(0, 9 * 4096),
        vec![
            ByteRepeat {
                to: 2 * 4096,
                from: 4096,
                len: 4096
            },
            ByteRepeat {
                to: 6 * 4096,
                from: 4096,
                len: 8192
            },
        ]
    );
    assert!(m.repeats_in(3 * 4096, 3 * 4096).is_empty());
    for cut in 0..b.len() {
        assert!(MetaFile::decode(&b[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn bad_repeats_are_refused() {
    let bad = [
        // Empty; source not before; overlapping itself; past the last
        // whole block (block 9 is partial); out of order.
        vec![Repeat {
            to: 2,
            from: 1,
            len: 0,
        }],
        vec![Repeat {
            to: 2,
            from: 2,
            len: 1,
        }],
        vec![Repeat {
            to: 2,
            from: 1,
            len: 2,
        }],
        vec![Repeat {
            to: 8,
            from: 1,
            len: 2,
        }],
        vec![
            Repeat {
                to: 6,
                from: 1,
                len: 1,
            },
            Repeat {
                to: 2,
                from: 1,
                len: 1,
            },
        ],
        vec![Repeat {
            to: u64::MAX,
            from: 1,
            len: 1,
        }],
    ];
    for repeats in bad {
        let mut m = sample();
        m.repeats = repeats.clone();
        assert!(m.validate().is_err(), "{repeats:?}");
        assert!(MetaFile::decode(&m.encode()).is_err(), "{repeats:?}");
    }
    // Version 2 announcing no repeats is not canonical.
    let mut b = sample().encode();
    b[8..12].copy_from_slice(&META_VERSION_REPEATS.to_le_bytes());
    let crc_at = b.len() - 4;
    b.truncate(crc_at);
    b.extend_from_slice(&0u32.to_le_bytes());
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    assert!(matches!(MetaFile::decode(&b), Err(MetaError::Invalid(_))));
}

proptest! {
    #[test]
    fn round_trip(m in arb_meta()) {
        let bytes = m.encode();
        prop_assert_eq!(bytes.len(), m.encoded_len());
        let back = MetaFile::decode(&bytes).expect("decodes");
        prop_assert_eq!(&back, &m);
        prop_assert_eq!(back.encode(), bytes);
    }

    #[test]
    fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = MetaFile::decode(&bytes);
    }

    #[test]
    fn decode_never_panics_with_valid_magic(
        mut bytes in prop::collection::vec(any::<u8>(), 0..512),
        version_ok in any::<bool>(),
        fix_crc in any::<bool>(),
    ) {
        // Random bodies behind a right magic and version, sometimes with
        // a right CRC too, so the field checks are reached.
        let mut input = META_MAGIC.to_vec();
        if version_ok {
            input.extend_from_slice(&META_VERSION.to_le_bytes());
        }
        input.append(&mut bytes);
        if fix_crc && input.len() >= 4 {
            let n = input.len() - 4;
            let crc = crc32fast::hash(&input[..n]);
            input[n..].copy_from_slice(&crc.to_le_bytes());
        }
        if let Ok(m) = MetaFile::decode(&input) {
            prop_assert!(m.validate().is_ok());
            prop_assert_eq!(m.encode(), input);
        }
    }

    #[test]
    fn zero_map_matches_a_model(
        bits in prop::collection::vec(any::<bool>(), 0..400),
        order in any::<u64>(),
    ) {
        // Set the zero blocks in a scrambled order: the general merge
        // path must agree with the in-order one.
        let mut idx: Vec<usize> = (0..bits.len()).filter(|&i| bits[i]).collect();
        let n = idx.len().max(1);
        idx.rotate_left((order as usize) % n);
        if order & 1 == 1 { idx.reverse(); }
        let mut m = ZeroMap::new(bits.len() as u64);
        for i in idx { m.set_zero(i as u64); }
        prop_assert_eq!(&m, &from_bits(&bits));
        for (i, &z) in bits.iter().enumerate() {
            prop_assert_eq!(m.is_zero(i as u64), z);
        }
        prop_assert!(!m.is_zero(bits.len() as u64));
        prop_assert_eq!(m.zero_blocks(), bits.iter().filter(|&&z| z).count() as u64);
        // Exact for random maps: the runs are the bitmap's runs.
        let transitions = bits.windows(2).filter(|w| w[0] != w[1]).count();
        let expect_runs = if bits.is_empty() { 0 }
            else { transitions + 1 + usize::from(bits[0]) };
        prop_assert_eq!(m.runs().len(), expect_runs);
    }

    #[test]
    fn range_is_zero_matches_bytes(
        bits in prop::collection::vec(any::<bool>(), 1..40),
        tail in 1u64..=4096,
        offset in 0u64..45 * 4096,
        len in 0u64..5 * 4096,
    ) {
        let mut m = sample();
        m.file_size = (bits.len() as u64 - 1) * 4096 + tail;
        m.zero = from_bits(&bits);
        let end = offset + len;
        let model = len > 0 && end <= m.file_size
            && (offset / 4096..end.div_ceil(4096)).all(|b| bits[b as usize]);
        prop_assert_eq!(m.range_is_zero(offset, len), model);
    }
}

#[test]
fn every_bit_flip_and_truncation_is_detected() {
    let mut metas = vec![sample()];
    let mut empty = sample();
    empty.file_size = 0;
    empty.zero = ZeroMap::new(0);
    metas.push(empty);
    for m in metas {
        let bytes = m.encode();
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(MetaFile::decode(&b).is_err(), "flip of bit {bit} accepted");
        }
        for len in 0..bytes.len() {
            assert!(
                MetaFile::decode(&bytes[..len]).is_err(),
                "truncation to {len} accepted"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(MetaFile::decode(&longer).is_err());
    }
}

#[test]
fn decode_errors_name_the_cause() {
    let bytes = sample().encode();
    assert_eq!(MetaFile::decode(&bytes[..20]), Err(MetaError::Truncated));
    assert_eq!(MetaFile::decode(b"GVFSMET"), Err(MetaError::Truncated));
    assert_eq!(MetaFile::decode(b"GVFSBANKxxxx"), Err(MetaError::BadMagic));
    let mut v9 = bytes.clone();
    v9[8] = 9;
    assert_eq!(MetaFile::decode(&v9), Err(MetaError::Version(9)));
    let mut flip = bytes.clone();
    flip[20] ^= 1;
    assert_eq!(MetaFile::decode(&flip), Err(MetaError::Checksum));
    let big = vec![0u8; MAX_META_LEN + 1];
    assert_eq!(
        MetaFile::decode(&big),
        Err(MetaError::TooLarge(MAX_META_LEN as u64 + 1))
    );
}

/// Re-signs `bytes` after a deliberate change, so field checks are hit.
fn resign(mut bytes: Vec<u8>) -> Vec<u8> {
    let n = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..n]);
    bytes[n..].copy_from_slice(&crc.to_le_bytes());
    bytes
}

#[test]
fn invalid_fields_are_refused_even_with_a_good_checksum() {
    let good = sample().encode();
    let cases: Vec<(usize, Vec<u8>)> = vec![
        (12, 3000u32.to_le_bytes().to_vec()),      // block size not 2^n
        (12, 2048u32.to_le_bytes().to_vec()),      // block size too small
        (12, (2u32 << 20).to_le_bytes().to_vec()), // block size too big
        (32, 1_000_000_000u32.to_le_bytes().to_vec()), // mtime ns
        (44, u32::MAX.to_le_bytes().to_vec()),     // ctime ns
        (48, 16u32.to_le_bytes().to_vec()),        // unknown action bit
        (16, (4096u64 * 20).to_le_bytes().to_vec()), // size vs runs
        (64, 1u32.to_le_bytes().to_vec()),         // first run changed
    ];
    for (off, field) in cases {
        let mut b = good.clone();
        b[off..off + field.len()].copy_from_slice(&field);
        let err = MetaFile::decode(&resign(b)).expect_err("accepted");
        assert!(matches!(err, MetaError::Invalid(_)), "{off}: {err:?}");
    }
    // An empty non-first run, even though the total is right.
    let mut m = sample();
    m.zero = ZeroMap::new(10);
    let mut b = m.encode();
    b.truncate(b.len() - 4);
    b[60..64].copy_from_slice(&3u32.to_le_bytes());
    b.truncate(64);
    for run in [5u32, 0, 5] {
        b.extend_from_slice(&run.to_le_bytes());
    }
    b.extend_from_slice(&[0; 4]);
    assert!(matches!(
        MetaFile::decode(&resign(b)),
        Err(MetaError::Invalid(_))
    ));
    // A split marker (u32::MAX, 0) with nothing after it.
    let mut m = sample();
    m.file_size = u64::from(u32::MAX) * 4096;
    m.zero = ZeroMap::new(u64::from(u32::MAX));
    let mut b = m.encode();
    b.truncate(60);
    b.extend_from_slice(&2u32.to_le_bytes());
    for run in [u32::MAX, 0] {
        b.extend_from_slice(&run.to_le_bytes());
    }
    b.extend_from_slice(&[0; 4]);
    assert!(matches!(
        MetaFile::decode(&resign(b)),
        Err(MetaError::Invalid(_))
    ));
}

#[test]
fn range_is_zero_stops_at_end_of_file() {
    let mut m = sample();
    m.file_size = 2 * 4096 + 100;
    m.zero = ZeroMap::new(3);
    m.zero.set_zero_range(0, 3);
    assert!(m.range_is_zero(0, m.file_size));
    assert!(m.range_is_zero(m.file_size - 10, 10));
    assert!(!m.range_is_zero(m.file_size - 10, 11));
    assert!(!m.range_is_zero(m.file_size, 1));
    assert!(!m.range_is_zero(0, 0));
    assert!(!m.range_is_zero(u64::MAX, 1));
    assert!(!m.range_is_zero(1, u64::MAX));
}

#[test]
fn long_runs_split_and_round_trip() {
    let blocks = 3 * u64::from(u32::MAX) + 7;
    let mut zero = ZeroMap::new(blocks);
    zero.set_zero_range(1, 2 * u64::from(u32::MAX) + 5);
    let m = MetaFile {
        block_size: 4096,
        file_size: blocks * 4096,
        mtime: (0, 0),
        ctime: (0, 0),
        actions: Actions::default(),
        compressed_size: 0,
        zero,
        repeats: Vec::new(),
        hashes: None,
    };
    let runs = m.zero.runs();
    assert_eq!(runs, vec![1, u32::MAX, 0, u32::MAX, 0, 4, u32::MAX, 0, 2]);
    assert_eq!(MetaFile::decode(&m.encode()), Ok(m));
}

#[test]
fn sparse_image_map_is_small() {
    // A 256 MiB image in 4 KiB blocks, ~60% zero in long runs.
    let blocks = (256u64 << 20) / 4096;
    let mut zero = ZeroMap::new(blocks);
    let mut at = 0;
    let mut i = 0u64;
    while at < blocks {
        let data = 200 + (i * 7919) % 1500;
        let zeros = 300 + (i * 104_729) % 2300;
        zero.set_zero_range(at + data, at + data + zeros);
        at += data + zeros;
        i += 1;
    }
    let frac = zero.zero_blocks() as f64 / blocks as f64;
    assert!((0.5..0.7).contains(&frac), "{frac}");
    let m = MetaFile {
        block_size: 4096,
        file_size: 256 << 20,
        mtime: (1, 2),
        ctime: (3, 4),
        actions: Actions::default(),
        compressed_size: 0,
        zero,
        repeats: Vec::new(),
        hashes: None,
    };
    let len = m.encode().len();
    assert!(len <= 400, "{len} bytes");
    // Exact, not lossy.
    assert_eq!(MetaFile::decode(&m.encode()), Ok(m));
}

#[test]
fn keep_longest_only_forgets() {
    let mut m = ZeroMap::new(100);
    for (s, e) in [(0, 1), (10, 30), (40, 42), (50, 51), (60, 99)] {
        m.set_zero_range(s, e);
    }
    let before = m.clone();
    m.keep_longest(2);
    assert_eq!(m.zero_ranges(), &[(10, 30), (60, 99)]);
    for b in 0..100 {
        assert!(!m.is_zero(b) || before.is_zero(b));
    }
}

#[test]
fn it_describes_the_version_it_was_scanned_from() {
    let m = sample();
    let v = m.file_version();
    assert_eq!((v.size, v.mtime, v.ctime), (m.file_size, m.mtime, m.ctime));
    let other_ctime = gvfs_nfs::FileVersion { ctime: (9, 9), ..v };
    assert!(v.same_but_ctime(&other_ctime) && v != other_ctime);
    let other_mtime = gvfs_nfs::FileVersion {
        mtime: (m.mtime.0, m.mtime.1 + 1),
        ..v
    };
    assert!(!v.same_but_ctime(&other_mtime));
}

#[test]
fn meta_names() {
    assert_eq!(meta_name("mem.vmss").as_deref(), Some(".mem.vmss.gvfsmeta"));
    assert_eq!(meta_name(".hidden").as_deref(), Some("..hidden.gvfsmeta"));
    for bad in [
        "",
        ".",
        "..",
        "a/b",
        "a\0b",
        ".x.gvfsmeta",
        "x.gvfsmeta",
        ".gvfsmeta",
    ] {
        assert_eq!(meta_name(bad), None, "{bad:?}");
    }
    let longest = "n".repeat(MAX_NAME_LEN - 1 - META_SUFFIX.len());
    assert_eq!(meta_name(&longest).map(|n| n.len()), Some(MAX_NAME_LEN));
    assert_eq!(meta_name(&format!("{longest}n")), None);
    assert!(is_meta_name(".mem.vmss.gvfsmeta"));
    assert!(is_meta_name("..hidden.gvfsmeta"));
    assert_eq!(described_name(".mem.vmss.gvfsmeta"), Some("mem.vmss"));
    for not in [
        ".gvfsmeta",
        "..gvfsmeta",
        "x.gvfsmeta",
        ".x.gvfsmeta.gvfsmeta",
        "mem",
    ] {
        assert!(!is_meta_name(not), "{not:?}");
    }
    // Every name meta_name gives is a metadata name describing its input.
    for name in ["a", "mem.vmss", ".a", "...", &longest] {
        let m = meta_name(name).expect("valid");
        assert_eq!(described_name(&m), Some(name));
    }
}

#[test]
fn actions_bits() {
    for bits in 0..16 {
        assert_eq!(Actions::from_bits(bits).map(Actions::bits), Some(bits));
    }
    assert_eq!(Actions::from_bits(1 << 4), None);
    assert_eq!(Actions::COMPRESS_AND_COPY.bits(), 15);
}

/// `sample()` with a fingerprint for each of its non-zero blocks (1, 2,
/// 6, 7, 8) and a hash for its one piece.
fn hashed() -> MetaFile {
    let mut m = sample();
    let fps = [1u8, 2, 6, 7, 8]
        .iter()
        .map(|&b| [b; FINGERPRINT_LEN])
        .collect();
    m.hashes = Some(std::sync::Arc::new(
        BlockHashes::new(fps, vec![[9; HASH_LEN]], &m.zero, m.block_size, m.file_size)
            .expect("one per data block and piece"),
    ));
    m
}

#[test]
fn hashes_round_trip_as_version_4_and_name_each_data_block() {
    let m = hashed();
    let bytes = m.encode();
    assert_eq!(bytes.len(), m.encoded_len());
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 4);
    assert_eq!(bytes.len(), 80 + 4 * m.zero.runs().len() + 8 * 5 + 32);
    let back = MetaFile::decode(&bytes).expect("decodes");
    assert_eq!(back, m);
    for block in 0..10u64 {
        let want = [1u64, 2, 6, 7, 8]
            .contains(&block)
            .then_some([block as u8; FINGERPRINT_LEN]);
        assert_eq!(
            back.block_fingerprint(block).copied(),
            want,
            "block {block}"
        );
    }
    assert_eq!(back.block_fingerprint(10), None);
    assert_eq!(back.piece_hash(0), Some(&[9; HASH_LEN]));
    assert_eq!(back.piece_hash(1), None);
    // With repeats too: one file, both lists.
    let mut both = hashed();
    both.repeats = vec![Repeat {
        to: 7,
        from: 1,
        len: 2,
    }];
    let back = MetaFile::decode(&both.encode()).expect("decodes");
    assert_eq!(back, both);
    // Without hashes, the older versions, byte for byte as before.
    assert_eq!(
        u32::from_le_bytes(sample().encode()[8..12].try_into().unwrap()),
        1
    );
    // Blocks larger than a piece cannot have hashes.
    let mut big = hashed();
    big.block_size = 128 << 10;
    assert!(big.validate().is_err());
}

/// A file of 5 pieces and a short sixth whose pieces 1..=2 and 5 are
/// zero pieces (piece 3 has one data block), with distinct piece hashes.
fn mostly_zero() -> (MetaFile, Vec<PieceHash>) {
    let per = HASH_PIECE / 4096;
    let size = 5 * HASH_PIECE + 3 * 4096;
    let mut zero = ZeroMap::new(size.div_ceil(4096));
    zero.set_zero_range(per, 4 * per - 1);
    zero.set_zero_range(4 * per + 1, 5 * per + 3);
    let mut m = MetaFile {
        file_size: size,
        zero,
        ..sample()
    };
    let data = m.blocks() - m.zero.zero_blocks();
    let fps = (0..data).map(|i| [i as u8; FINGERPRINT_LEN]).collect();
    let all: Vec<PieceHash> = (0..6u8).map(|i| [i + 1; HASH_LEN]).collect();
    let h = BlockHashes::new(fps, all.clone(), &m.zero, m.block_size, size).expect("counts");
    m.hashes = Some(std::sync::Arc::new(h));
    (m, all)
}

#[test]
fn zero_pieces_hashes_are_implied_not_written() {
    let (m, all) = mostly_zero();
    let h = m.hashes.as_deref().expect("hashes");
    assert_eq!(h.pieces(), &[all[0], all[3], all[4]]);
    let bytes = m.encode();
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 4);
    assert_eq!(bytes.len(), m.encoded_len());
    let back = MetaFile::decode(&bytes).expect("decodes");
    assert_eq!(back, m);
    let zero_piece = piece_hash(&[0; HASH_PIECE as usize]);
    let want = [
        all[0],
        zero_piece,
        zero_piece,
        all[3],
        all[4],
        piece_hash(&[0; 3 * 4096]),
    ];
    for (p, want) in want.iter().enumerate() {
        assert_eq!(back.piece_hash(p as u64), Some(want), "piece {p}");
    }
    assert_eq!(back.piece_hash(6), None);

    // Version 3 wrote every piece's hash: read, the zero pieces' left out.
    let v4_hashes = 3 * HASH_LEN + 4;
    let mut v3 = bytes[..bytes.len() - 4 - v4_hashes].to_vec();
    v3[8..12].copy_from_slice(&3u32.to_le_bytes());
    v3.extend_from_slice(&6u32.to_le_bytes());
    for h in &all {
        v3.extend_from_slice(h);
    }
    let crc = crc32fast::hash(&v3);
    v3.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(MetaFile::decode(&v3).expect("version 3 decodes"), m);

    // Version 4 with every piece's hash, checksum made good: refused.
    let mut wrong = v3.clone();
    wrong[8..12].copy_from_slice(&4u32.to_le_bytes());
    let n = wrong.len() - 4;
    let crc = crc32fast::hash(&wrong[..n]);
    wrong[n..].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        MetaFile::decode(&wrong),
        Err(MetaError::Invalid(_))
    ));
}

#[test]
fn a_hash_list_of_the_wrong_length_is_refused() {
    let m = hashed();
    let fps = |n| vec![[0; FINGERPRINT_LEN]; n];
    let one = || vec![[0; HASH_LEN]];
    assert!(BlockHashes::new(fps(4), one(), &m.zero, m.block_size, m.file_size).is_none());
    assert!(BlockHashes::new(fps(6), one(), &m.zero, m.block_size, m.file_size).is_none());
    assert!(BlockHashes::new(fps(5), vec![], &m.zero, m.block_size, m.file_size).is_none());
    assert!(BlockHashes::new(fps(5), one(), &m.zero, m.block_size, m.file_size).is_some());
    // A file claiming 4 fingerprints for 5 data blocks, checksum made good.
    let bytes = m.encode();
    let fp_at = bytes.len() - 4 - HASH_LEN - 4 - 5 * FINGERPRINT_LEN;
    let mut short = bytes[..fp_at - 4].to_vec();
    short.extend_from_slice(&4u32.to_le_bytes());
    short.extend_from_slice(&bytes[fp_at..fp_at + 4 * FINGERPRINT_LEN]);
    short.extend_from_slice(&bytes[fp_at + 5 * FINGERPRINT_LEN..]);
    let e = MetaFile::decode(&resign(short)).expect_err("short list");
    assert!(e.to_string().contains("4 block fingerprints for 5"), "{e}");
    // A count past the input is truncation, found before allocating.
    let mut bytes = m.encode();
    let count_at = bytes.len() - 4 - HASH_LEN - 4;
    bytes[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        MetaFile::decode(&resign(bytes)),
        Err(MetaError::Truncated)
    ));
    // A newer version than this proxy knows is refused by name.
    let mut bytes = m.encode();
    bytes[8..12].copy_from_slice(&5u32.to_le_bytes());
    assert!(matches!(
        MetaFile::decode(&resign(bytes)),
        Err(MetaError::Version(5))
    ));
}
