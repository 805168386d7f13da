//! Frames: chunks handed to other proxies as they came, kept beside
//! their file.

use super::*;

#[tokio::test]
async fn a_lan_proxy_hands_frames_with_repeats_only_to_callers_that_fill_them() {
    let c = u64::from(CHUNK);
    let len = 3 * CHUNK as usize;
    let (data, list) = with_repeats(content(len), &[(2 * c + 8192, 4096, 8192)]);
    let (_dir, fake, cache, f) = started(b"fhl", data.clone(), true, None, true);
    *lock(&fake.repeats) = list.clone();
    let cred = Credentials::default();
    let (all, _) = f
        .read(&cache, &src(&fake), &cred, 0, len as u32, &DEMAND)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(all == data);
    // As it came: zeros where the repeat is, and the list.
    let (frame, n, _, _) = f
        .read_frame(
            &cache,
            &src(&fake),
            &cred,
            2 * c,
            CHUNK,
            Asked::new(true, BACKGROUND),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(frame.repeats, list);
    let mut holes = data[2 * c as usize..].to_vec();
    holes[8192..16384].fill(0);
    assert!(unframe(&frame, n) == holes);
    // A caller that does not fill repeats gets the whole chunk.
    let (frame, n, _, _) = f
        .read_frame(
            &cache,
            &src(&fake),
            &cred,
            2 * c,
            CHUNK,
            Asked::new(false, BACKGROUND),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(frame.repeats.is_empty());
    assert!(unframe(&frame, n) == data[2 * c as usize..]);
    let s = cache.stats();
    assert_eq!(
        (s.counts.frames_reused, s.counts.frames_made),
        (1, 0),
        "{s:?}"
    );
}

/// Bytes that do not compress.
fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub(super) fn unframe(frame: &Frame, raw_len: u32) -> Vec<u8> {
    gvfs_ext::decompress(FetchOk {
        attrs: attrs(0, 0),
        raw_len,
        eof: false,
        codec: frame.codec,
        data: frame.data.clone(),
        repeats: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn other_proxies_get_the_frames_chunks_came_in() {
    let len = 3 * CHUNK as usize + 500;
    let (_dir, fake, c, f) = started(b"ff", content(len), true, None, true);
    let cred = Credentials::default();
    whole(&c).await;
    let s = c.stats();
    assert!(
        s.counts.fetch_micros > 0 && s.counts.decompress_micros > 0,
        "{s:?}"
    );
    let mut served = Vec::new();
    for i in 0..4u64 {
        let (frame, n, eof, _) = f
            .read_frame(
                &c,
                &src(&fake),
                &cred,
                i * u64::from(CHUNK),
                CHUNK,
                Asked::new(true, BACKGROUND),
                None,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(eof, i == 3);
        served.extend(unframe(&frame, n));
    }
    assert!(served == fake.data);
    let s = c.stats();
    assert_eq!(
        (s.counts.frames_reused, s.counts.frames_made),
        (4, 0),
        "{s:?}"
    );
    assert!(s.frame_bytes > 0 && s.frame_bytes < len as u64);
    // A write drops the chunk's frame: the next FETCH sees the write.
    f.write(&c, &cred, 10, b"new".to_vec(), false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (frame, n, _, _) = f
        .read_frame(
            &c,
            &src(&fake),
            &cred,
            0,
            CHUNK,
            Asked::new(true, BACKGROUND),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&unframe(&frame, n)[10..13], b"new");
    assert_eq!(c.stats().counts.frames_made, 1);
    // A piece of a chunk is compressed for the caller, not kept.
    let (frame, n, _, _) = f
        .read_frame(
            &c,
            &src(&fake),
            &cred,
            u64::from(CHUNK) + 7,
            100,
            Asked::new(true, BACKGROUND),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let at = CHUNK as usize + 7;
    assert!(unframe(&frame, n)[..] == fake.data[at..at + 100]);
    let s = c.stats();
    assert_eq!((s.counts.frames_reused, s.counts.frames_made), (4, 1));
}

#[tokio::test]
async fn frames_live_beside_their_file_and_go_with_it() {
    let len = 4 * CHUNK as usize;
    let (dir, index, c, fake) = restartable(noise(len));
    c.keep_frames();
    let cred = Credentials::default();
    let f = c
        .start(b"fb", &fake.attrs, None, fake.clone(), &cred, false, &FIRST)
        .unwrap_or_else(|e| panic!("{e}"));
    whole(&c).await;
    // These chunks do not compress: the frames hold the whole file.
    let frames = dir.path().join(format!("{}.frames", file_name(b"fb")));
    let on_disk = std::fs::metadata(&frames).map_or(0, |m| m.len());
    assert_eq!(on_disk, len as u64);
    assert_eq!(c.stats().frame_bytes, len as u64);
    // Made again after a write, they stop growing at a chunk past the
    // file's size, and are still served.
    for round in 0..3u8 {
        for i in 0..4u64 {
            let at = i * u64::from(CHUNK);
            f.write(&c, &cred, at, vec![round; 10], false)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let (frame, n, _, _) = f
                .read_frame(
                    &c,
                    &src(&fake),
                    &cred,
                    at,
                    CHUNK,
                    Asked::new(true, BACKGROUND),
                    None,
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(unframe(&frame, n)[..10], vec![round; 10][..]);
        }
    }
    let s = c.stats();
    assert!(s.frame_bytes <= len as u64 + u64::from(CHUNK), "{s:?}");
    assert_eq!(s.counts.frames_made, 1, "{s:?}");
    // A restart drops them; so does letting the file go.
    c.write_back(fake.as_ref())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!frames.exists(), "frames outlived their file");
    std::fs::write(&frames, b"left by a crash").unwrap_or_else(|e| panic!("{e}"));
    drop(c);
    reopen(dir.path(), &index);
    assert!(!frames.exists(), "a restart kept old frames");
}

#[tokio::test]
async fn a_run_made_for_one_proxy_is_kept_for_the_next_until_a_write() {
    let len = 2 * CHUNK as usize;
    let (_dir, fake, cache, f) = started(b"fhr", content(len), true, None, true);
    let cred = Credentials::default();
    let at = u64::from(CHUNK) + 3 * 8192;
    let run = |cache: &Arc<FileCache>, f: &Arc<CachedFile>| {
        let (cache, f, fake, cred) = (cache.clone(), f.clone(), fake.clone(), cred.clone());
        async move {
            let (frame, n, _, _) = f
                .read_frame(
                    &cache,
                    &src(&fake),
                    &cred,
                    at,
                    4 * 8192,
                    Asked::new(false, Want::local(Class::Profile)),
                    None,
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            unframe(&frame, n)
        }
    };
    let first = run(&cache, &f).await;
    assert!(first[..] == fake.data[at as usize..at as usize + 4 * 8192]);
    let second = run(&cache, &f).await;
    assert!(second == first);
    let s = cache.stats();
    assert_eq!(s.counts.run_frames_reused, 1, "{s:?}");
    assert!(s.run_frame_bytes > 0);
    // A write into the run: the next proxy gets the new bytes. Writes
    // are held only once the file is whole.
    whole(&cache).await;
    f.write(&cache, &cred, at + 100, b"new bytes".to_vec(), false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let third = run(&cache, &f).await;
    assert_eq!(&third[100..109], b"new bytes");
    assert_eq!(cache.stats().counts.run_frames_reused, 1);
    assert!(run(&cache, &f).await == third);
    assert_eq!(cache.stats().counts.run_frames_reused, 2);
}
