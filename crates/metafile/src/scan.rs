//! Making a metadata file from a local file: [`scan`] reads it block by
//! block (skipping holes), [`write_beside`] puts `.NAME.gvfsmeta` next to it.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use crate::format::{
    Actions, LEVEL, MAX_BLOCK_SIZE, MAX_MAP_LEN, MAX_META_LEN, MIN_BLOCK_SIZE, MetaFile, Repeat,
    block_count, meta_name,
};
use crate::hashes::{
    BlockHashes, FINGERPRINT_LEN, Fingerprint, HASH_LEN, HASH_PIECE, PieceHash, fingerprint,
    piece_hash,
};
use crate::zeromap::ZeroMap;

/// Bytes read at a time.
const BUF_LEN: usize = 1 << 20;
/// Most distinct blocks remembered while looking for repeats (about 40
/// bytes each); blocks after that are still matched against them.
const MAX_DISTINCT_BLOCKS: usize = 1 << 22;

/// Scans the regular file at `path` into a [`MetaFile`]: its size, mtime
/// and ctime (nanoseconds), which `block_size` blocks are all zeros (holes
/// are found with `SEEK_DATA`/`SEEK_HOLE` and not read), and, when
/// `actions.compress`, the size of the whole file as one zstd level 3
/// stream (computed streaming) and, when `repeats` too, the blocks that
/// repeat earlier blocks byte for byte (a second pass over the non-zero
/// blocks; each match is read back and compared, never trusted to a hash),
/// and, when `hashes` (compressed or not), the fingerprint of every non-zero block and the
/// hash of every 64 KiB piece (a last pass; left out when they would not
/// fit [`MAX_META_LEN`] or blocks are larger than a piece).
/// `progress` is called with the work done so far, in bytes: each pass
/// counts the file's size on ([`scan_work`] is the whole).
///
/// Fails with `InvalidInput` for a bad block size or a file that is not
/// regular, and with `Other` if the file changed while it was scanned. A
/// zero map too fragmented for [`MAX_META_LEN`] keeps only its longest zero
/// runs (the forgotten blocks are then simply read).
pub fn scan(
    path: &Path,
    block_size: u32,
    actions: Actions,
    repeats: bool,
    hashes: bool,
    progress: &mut dyn FnMut(u64),
) -> io::Result<MetaFile> {
    if !block_size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "block size {block_size} is not a power of two in {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE}"
            ),
        ));
    }
    let file = File::open(path)?;
    let before = file.metadata()?;
    if !before.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    let size = before.len();
    let hash_pass_at = scan_work(size, actions, repeats, false);
    let mut zeros = ZeroScanner::new(size, block_size);
    let mut zstd = if actions.compress {
        Some(zstd::stream::write::Encoder::new(ByteCounter(0), LEVEL)?)
    } else {
        None
    };
    let mut buf = vec![0u8; BUF_LEN];
    let mut pos = 0u64;
    let mut extent = (0u64, 0u64);
    while pos < size {
        if pos >= extent.1 {
            extent = data_extent(&file, pos, size);
        }
        let (data_start, data_end) = extent;
        let (n, hole) = if pos < data_start {
            ((data_start - pos).min(BUF_LEN as u64) as usize, true)
        } else {
            ((data_end - pos).min(BUF_LEN as u64) as usize, false)
        };
        if hole {
            if zstd.is_some() {
                buf[..n].fill(0);
            }
            zeros.zeros(n as u64);
        } else {
            file.read_exact_at(&mut buf[..n], pos).map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    changed(path)
                } else {
                    e
                }
            })?;
            zeros.data(&buf[..n]);
        }
        if let Some(z) = zstd.as_mut() {
            z.write_all(&buf[..n])?;
        }
        pos += n as u64;
        progress(pos);
    }
    let zero = zeros.finish();
    let repeats = if actions.compress && repeats {
        let mut progress = |at: u64| progress(size + at);
        find_repeats(&file, &zero, size, block_size, &mut progress).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                changed(path)
            } else {
                e
            }
        })?
    } else {
        Vec::new()
    };
    let after = file.metadata()?;
    if (after.len(), times(&after)) != (size, times(&before)) {
        return Err(changed(path));
    }
    let compressed_size = match zstd {
        Some(z) => z.finish()?.0,
        None => 0,
    };
    let (mtime, ctime) = times(&before);
    let mut meta = MetaFile {
        block_size,
        file_size: size,
        mtime,
        ctime,
        actions,
        compressed_size,
        zero,
        repeats,
        hashes: None,
    };
    if meta.encoded_len() > MAX_MAP_LEN {
        // Repeats only save bytes; the longest are kept, up to half the room.
        let room = (MAX_MAP_LEN / 2) / 20;
        if meta.repeats.len() > room {
            meta.repeats.sort_by_key(|r| std::cmp::Reverse(r.len));
            meta.repeats.truncate(room);
            meta.repeats.sort_by_key(|r| r.to);
        }
    }
    while meta.encoded_len() > MAX_MAP_LEN {
        let keep = meta.zero.zero_ranges().len().min((MAX_MAP_LEN - 68) / 8) * 3 / 4;
        meta.zero.keep_longest(keep);
    }
    let data_blocks = meta.blocks() - meta.zero.zero_blocks();
    let hash_bytes =
        8 + FINGERPRINT_LEN as u64 * data_blocks + HASH_LEN as u64 * size.div_ceil(HASH_PIECE);
    let fits = meta.encoded_len() as u64 + hash_bytes <= MAX_META_LEN as u64;
    if hashes && fits && u64::from(block_size) <= HASH_PIECE {
        let done = hash_pass_at;
        let mut progress = |at: u64| progress(done + at);
        let (fingerprints, pieces) =
            hash_blocks(&file, &meta.zero, size, block_size, &mut progress).map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    changed(path)
                } else {
                    e
                }
            })?;
        let after = file.metadata()?;
        if (after.len(), times(&after)) != (size, times(&before)) {
            return Err(changed(path));
        }
        meta.hashes = BlockHashes::new(fingerprints, pieces, &meta.zero, block_size, size)
            .map(std::sync::Arc::new);
    }
    Ok(meta)
}

/// The fingerprint of each block of `file` that `zero` does not call
/// zero, in block order, and the hash of each [`HASH_PIECE`] of it (the
/// last block and piece up to the end of the file). `block_size` is at
/// most a piece.
fn hash_blocks(
    file: &File,
    zero: &ZeroMap,
    size: u64,
    block_size: u32,
    progress: &mut dyn FnMut(u64),
) -> io::Result<(Vec<Fingerprint>, Vec<PieceHash>)> {
    let bs = u64::from(block_size);
    let zero_piece = piece_hash(&vec![0u8; HASH_PIECE as usize]);
    let (mut fingerprints, mut pieces) = (Vec::new(), Vec::new());
    let mut buf = vec![0u8; BUF_LEN];
    let mut at = 0u64;
    while at < size {
        let end = (at + BUF_LEN as u64).min(size);
        if zero.all_zero(at / bs, end.div_ceil(bs)) {
            for p in (at..end).step_by(HASH_PIECE as usize) {
                let len = HASH_PIECE.min(size - p);
                pieces.push(if len == HASH_PIECE {
                    zero_piece
                } else {
                    piece_hash(&vec![0u8; len as usize])
                });
            }
        } else {
            let bytes = &mut buf[..(end - at) as usize];
            file.read_exact_at(bytes, at)?;
            for piece in bytes.chunks(HASH_PIECE as usize) {
                pieces.push(piece_hash(piece));
            }
            for (i, block) in bytes.chunks(bs as usize).enumerate() {
                if !zero.is_zero(at / bs + i as u64) {
                    fingerprints.push(fingerprint(block));
                }
            }
        }
        at = end;
        progress(at);
    }
    progress(size);
    Ok((fingerprints, pieces))
}

/// The whole non-zero blocks of `file` that repeat an earlier block byte for
/// byte, as runs. Blocks are matched by a hash of their bytes and every
/// match is confirmed by reading the earlier block again.
/// Bytes of work [`scan`] reports through `progress` for a file of `size`
/// (with `repeats` and `hashes` as given to it).
pub fn scan_work(size: u64, actions: Actions, repeats: bool, hashes: bool) -> u64 {
    let passes = 1 + u64::from(actions.compress && repeats) + u64::from(hashes);
    passes * size
}

/// The second pass of [`scan`]: `progress` gets the offset reached.
fn find_repeats(
    file: &File,
    zero: &ZeroMap,
    size: u64,
    block_size: u32,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Vec<Repeat>> {
    let bs = block_size as usize;
    let whole = size / u64::from(block_size);
    let per_read = (BUF_LEN / bs).max(1) as u64;
    let hasher = BuildHasherDefault::<DefaultHasher>::default();
    let mut first: HashMap<u64, u64> = HashMap::new();
    let mut repeats: Vec<Repeat> = Vec::new();
    let mut buf = vec![0u8; per_read as usize * bs];
    let mut earlier = vec![0u8; bs];
    let mut at = 0u64;
    while at < whole {
        let n = per_read.min(whole - at);
        if zero.all_zero(at, at + n) {
            at += n;
            continue;
        }
        let bytes = &mut buf[..n as usize * bs];
        file.read_exact_at(bytes, at * u64::from(block_size))?;
        for (i, block) in bytes.chunks_exact(bs).enumerate() {
            let b = at + i as u64;
            if zero.is_zero(b) {
                continue;
            }
            let h = hasher.hash_one(block);
            match first.get(&h) {
                Some(&f) => {
                    file.read_exact_at(&mut earlier, f * u64::from(block_size))?;
                    if earlier != block {
                        continue;
                    }
                    match repeats.last_mut() {
                        Some(r)
                            if r.to + u64::from(r.len) == b
                                && r.from + u64::from(r.len) == f
                                && f < r.to
                                && r.len < u32::MAX =>
                        {
                            r.len += 1
                        }
                        _ => repeats.push(Repeat {
                            to: b,
                            from: f,
                            len: 1,
                        }),
                    }
                }
                None if first.len() < MAX_DISTINCT_BLOCKS => {
                    first.insert(h, b);
                }
                None => {}
            }
        }
        at += n;
        progress(at * u64::from(block_size));
    }
    progress(size);
    Ok(repeats)
}

fn changed(path: &Path) -> io::Error {
    io::Error::other(format!("{} changed while it was scanned", path.display()))
}

/// (mtime, ctime) as (seconds, nanoseconds); times before 1970 read as 0.
fn times(m: &std::fs::Metadata) -> ((u64, u32), (u64, u32)) {
    let t = |s: i64, ns: i64| {
        (
            u64::try_from(s).unwrap_or(0),
            ns.clamp(0, 999_999_999) as u32,
        )
    };
    (t(m.mtime(), m.mtime_nsec()), t(m.ctime(), m.ctime_nsec()))
}

/// The data extent at or after `pos`: `(start, end)` with everything in
/// `pos..start` a hole. Without `SEEK_DATA` support it is `(pos, size)`.
pub fn data_extent(file: &File, pos: u64, size: u64) -> (u64, u64) {
    use rustix::fs::{SeekFrom, seek};
    let start = match seek(file, SeekFrom::Data(pos)) {
        Ok(start) => start.clamp(pos, size),
        // No data after pos: the rest of the file is a hole.
        Err(rustix::io::Errno::NXIO) => return (size, size),
        Err(_) => return (pos, size),
    };
    let end = match seek(file, SeekFrom::Hole(start)) {
        Ok(end) => end.clamp(start, size),
        Err(_) => size,
    };
    // A file growing under us could give an empty extent: read the rest.
    if start < size && end == start {
        return (pos, size);
    }
    (start, end)
}

/// Builds a [`ZeroMap`] from the file's bytes in order, given as data
/// buffers and runs of hole (known zero) bytes.
struct ZeroScanner {
    block_size: u64,
    pos: u64,
    /// Whether the block containing `pos` has a non-zero byte so far.
    dirty: bool,
    map: ZeroMap,
}

impl ZeroScanner {
    fn new(size: u64, block_size: u32) -> Self {
        ZeroScanner {
            block_size: u64::from(block_size),
            pos: 0,
            dirty: false,
            map: ZeroMap::new(block_count(size, block_size)),
        }
    }

    fn end_block(&mut self, block: u64) {
        if !self.dirty {
            self.map.set_zero(block);
        }
        self.dirty = false;
    }

    /// `n` zero bytes, without looking at them.
    fn zeros(&mut self, n: u64) {
        let bs = self.block_size;
        let end = self.pos + n;
        if !self.pos.is_multiple_of(bs) {
            let block_end = (self.pos / bs + 1) * bs;
            if end < block_end {
                self.pos = end;
                return;
            }
            self.end_block(self.pos / bs);
            self.pos = block_end;
        }
        let whole_end = end / bs * bs;
        if whole_end > self.pos {
            self.map.set_zero_range(self.pos / bs, whole_end / bs);
        }
        self.pos = end;
    }

    fn data(&mut self, mut bytes: &[u8]) {
        let bs = self.block_size;
        while !bytes.is_empty() {
            let room = (bs - self.pos % bs) as usize;
            let (part, rest) = bytes.split_at(room.min(bytes.len()));
            if !self.dirty && !all_zero(part) {
                self.dirty = true;
            }
            self.pos += part.len() as u64;
            bytes = rest;
            if self.pos.is_multiple_of(bs) {
                self.end_block(self.pos / bs - 1);
            }
        }
    }

    /// The map; a last, partial block counts up to end of file.
    fn finish(mut self) -> ZeroMap {
        if !self.pos.is_multiple_of(self.block_size) {
            self.end_block(self.pos / self.block_size);
        }
        self.map
    }
}

fn all_zero(bytes: &[u8]) -> bool {
    // OR-folding fixed chunks vectorizes; stop at the first non-zero chunk.
    bytes
        .chunks(4096)
        .all(|c| c.iter().fold(0u8, |a, &b| a | b) == 0)
}

/// Counts what a zstd encoder writes, and drops it.
struct ByteCounter(u64);

impl Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes `meta` as `.NAME.gvfsmeta` beside the file `path` (= `DIR/NAME`),
/// atomically: a temporary file in `DIR`, synced, renamed over the old one.
/// Returns the metadata file's path. The described file is not touched
/// (its mtime and ctime stay as scanned); `DIR`'s mtime changes.
///
/// The metadata file gets the file's owner and group where this process
/// may give them (as root), and the file's read and write bits, less
/// group-write when its group is not the file's: so it is readable by
/// whoever may read the file, and trusted by proxies (see
/// [`trust`](crate::trust)) when written by root or by the file's owner.
pub fn write_beside(path: &Path, meta: &MetaFile) -> io::Result<PathBuf> {
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| invalid(format!("{}: no UTF-8 file name", path.display())))?;
    let meta_file =
        meta_name(name).ok_or_else(|| invalid(format!("{name:?} cannot have a metadata file")))?;
    let bytes = meta.encode();
    if bytes.len() > MAX_META_LEN {
        return Err(invalid(format!(
            "metadata of {} bytes is over the {MAX_META_LEN} byte limit",
            bytes.len()
        )));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".gvfsmeta-tmp-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let target = dir.join(meta_file);
    let image = std::fs::metadata(path)?;
    let write = || -> io::Result<()> {
        let mut f = File::options().write(true).create_new(true).open(&tmp)?;
        like_the_file(&f, &image)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &target)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // Make the rename durable; not fatal where a directory can't be synced.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(target)
}

/// Gives the new metadata file `f` the owner, group and permissions that
/// [`write_beside`] promises, as far as this process may.
fn like_the_file(f: &File, image: &std::fs::Metadata) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // Root may give it the file's owner; anyone may try the file's group.
    if std::os::unix::fs::fchown(f, Some(image.uid()), Some(image.gid())).is_err() {
        let _ = std::os::unix::fs::fchown(f, None, Some(image.gid()));
    }
    let mut mode = image.mode() & 0o666;
    if f.metadata()?.gid() != image.gid() {
        mode &= !0o020;
    }
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MetaError;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// A random sparse file: a model of its bytes as segments, written with
    /// real holes (set_len / seeking past them) and explicit zero runs.
    #[derive(Debug)]
    enum Seg {
        Hole(u64),
        Zeros(u64),
        Data(Vec<u8>),
    }

    fn make_file(rng: &mut StdRng, dir: &Path, name: &str) -> (PathBuf, Vec<u8>) {
        let path = dir.join(name);
        let mut segs = Vec::new();
        for _ in 0..rng.gen_range(0..12) {
            let len = match rng.gen_range(0..4) {
                0 => rng.gen_range(1..5000),
                1 => rng.gen_range(1..200_000),
                _ => rng.gen_range(1..3 << 20),
            };
            segs.push(match rng.gen_range(0..3) {
                0 => Seg::Hole(len),
                1 => Seg::Zeros(len),
                _ => {
                    // Mostly non-zero, sometimes a single non-zero byte.
                    let mut d = vec![0u8; len as usize];
                    if rng.gen_bool(0.3) {
                        let i = rng.gen_range(0..d.len());
                        d[i] = rng.gen_range(1..=255);
                    } else {
                        rng.fill(&mut d[..]);
                    }
                    Seg::Data(d)
                }
            });
        }
        let f = File::create(&path).expect("create");
        let mut model = Vec::new();
        for s in &segs {
            match s {
                Seg::Hole(n) => model.resize(model.len() + *n as usize, 0),
                Seg::Zeros(n) => {
                    f.write_all_at(&vec![0; *n as usize], model.len() as u64)
                        .expect("write");
                    model.resize(model.len() + *n as usize, 0);
                }
                Seg::Data(d) => {
                    f.write_all_at(d, model.len() as u64).expect("write");
                    model.extend_from_slice(d);
                }
            }
        }
        // A trailing hole needs the size set explicitly.
        f.set_len(model.len() as u64).expect("set_len");
        (path, model)
    }

    fn model_map(bytes: &[u8], bs: u32) -> ZeroMap {
        let mut m = ZeroMap::new(block_count(bytes.len() as u64, bs));
        for (i, block) in bytes.chunks(bs as usize).enumerate() {
            if block.iter().all(|&b| b == 0) {
                m.set_zero(i as u64);
            }
        }
        m
    }

    #[test]
    fn zero_maps_of_random_sparse_files_match_the_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rng = StdRng::seed_from_u64(0x6766_7366);
        for i in 0..24 {
            let (path, model) = make_file(&mut rng, dir.path(), &format!("f{i}"));
            for bs in [4 << 10, 64 << 10, 1 << 20] {
                let mut last = 0;
                let meta = scan(&path, bs, Actions::default(), false, false, &mut |n| {
                    assert!(n > last && n <= model.len() as u64);
                    last = n;
                })
                .expect("scan");
                assert_eq!(last, model.len() as u64);
                assert_eq!(meta.file_size, model.len() as u64);
                assert_eq!(meta.zero, model_map(&model, bs), "file {i}, bs {bs}");
                assert_eq!(meta.compressed_size, 0);
                assert_eq!(MetaFile::decode(&meta.encode()), Ok(meta));
            }
        }
    }

    #[test]
    fn scanner_handles_any_split_of_holes_and_data() {
        // The same bytes fed as holes and data in random pieces.
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..200 {
            let len = rng.gen_range(0..40_000);
            let mut bytes = vec![0u8; len];
            for _ in 0..rng.gen_range(0..6) {
                if len > 0 {
                    let i = rng.gen_range(0..len);
                    bytes[i] = 1;
                }
            }
            let mut s = ZeroScanner::new(len as u64, 4096);
            let mut at = 0;
            while at < len {
                let n = rng.gen_range(1..=(len - at).min(9000));
                let part = &bytes[at..at + n];
                if all_zero(part) && rng.gen_bool(0.5) {
                    s.zeros(n as u64);
                } else {
                    s.data(part);
                }
                at += n;
            }
            assert_eq!(s.finish(), model_map(&bytes, 4096));
        }
    }

    #[test]
    fn a_single_non_zero_byte_anywhere_makes_its_block_non_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("one");
        let size = 3 * 65536 + 1000;
        let offsets = [0, 1, 4095, 4096, 65535, 65536, 100_000, size - 1];
        for &at in &offsets {
            let mut data = vec![0u8; size as usize];
            data[at as usize] = 1;
            std::fs::write(&path, &data).expect("write");
            for bs in [4096, 65536] {
                let meta =
                    scan(&path, bs, Actions::default(), false, false, &mut |_| {}).expect("scan");
                assert_eq!(meta.zero, model_map(&data, bs), "byte at {at}, bs {bs}");
                assert_eq!(meta.zero.zero_blocks(), meta.zero.blocks() - 1);
            }
        }
    }

    #[test]
    fn a_file_changed_while_scanned_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("busy");
        let data = vec![5u8; 3 << 20];
        // Rewritten in place (mtime moves), or cut short under the scan.
        let rewrite = |p: &Path| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let f = File::options().write(true).open(p).expect("open");
            f.write_all_at(b"x", 0).expect("write");
        };
        let shrink = |p: &Path| {
            let f = File::options().write(true).open(p).expect("open");
            f.set_len(1 << 20).expect("truncate");
        };
        for change in [&rewrite as &dyn Fn(&Path), &shrink] {
            std::fs::write(&path, &data).expect("write");
            let mut first = true;
            let e = scan(&path, 4096, Actions::default(), false, false, &mut |_| {
                if std::mem::take(&mut first) {
                    change(&path);
                }
            })
            .expect_err("change not noticed");
            assert!(e.to_string().contains("changed while"), "{e}");
        }
    }

    #[test]
    fn times_sizes_and_compressed_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("img");
        let mut data = vec![0u8; 300_000];
        data[..5000].fill(7);
        data[250_000..]
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i * 31 % 251) as u8);
        std::fs::write(&path, &data).expect("write");
        let m = std::fs::metadata(&path).expect("stat");
        let meta = scan(
            &path,
            4096,
            Actions::COMPRESS_AND_COPY,
            true,
            false,
            &mut |_| {},
        )
        .expect("scan");
        assert_eq!(meta.mtime, (m.mtime() as u64, m.mtime_nsec() as u32));
        assert_eq!(meta.ctime, (m.ctime() as u64, m.ctime_nsec() as u32));
        assert_eq!(meta.file_version().size, m.len());
        assert_eq!(meta.actions, Actions::COMPRESS_AND_COPY);
        let expect = zstd::encode_all(&data[..], LEVEL).expect("zstd").len() as u64;
        assert_eq!(meta.compressed_size, expect);
        assert!(meta.range_is_zero(8192, 4096 * 40));
        assert!(!meta.range_is_zero(4096, 4096));
    }

    #[test]
    fn a_file_read_block_by_block_gets_hashes_when_asked() {
        use crate::hashes::{HASH_PIECE, fingerprint, piece_hash};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("disk");
        // Data, a zero run, data, and a partial tail.
        let mut data: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect();
        data.extend_from_slice(&vec![0u8; 3 * 4096]);
        data.extend((0..40_000u32).map(|i| (i % 13 + 1) as u8));
        std::fs::write(&path, &data).expect("write");
        let meta = scan(&path, 4096, Actions::default(), false, true, &mut |_| {}).expect("scan");
        assert!(!meta.actions.compress);
        let back = MetaFile::decode(&meta.encode()).expect("decode");
        assert_eq!(back.version(), 4);
        assert!(back.hashes.is_some());
        for (b, block) in data.chunks(4096).enumerate() {
            let fp = back.block_fingerprint(b as u64);
            if block.iter().all(|&x| x == 0) {
                assert_eq!(fp, None, "block {b}");
            } else {
                assert_eq!(fp, Some(&fingerprint(block)), "block {b}");
            }
        }
        for (p, piece) in data.chunks(HASH_PIECE as usize).enumerate() {
            assert_eq!(back.piece_hash(p as u64), Some(&piece_hash(piece)));
        }
        // Not asked, or blocks larger than a piece: none.
        let plain = scan(&path, 4096, Actions::default(), false, false, &mut |_| {}).expect("scan");
        assert!(plain.hashes.is_none());
        let big = scan(&path, 131_072, Actions::default(), false, true, &mut |_| {}).expect("scan");
        assert!(big.hashes.is_none());
    }

    #[test]
    fn repeats_are_exactly_the_blocks_seen_before() {
        let mut rng = StdRng::seed_from_u64(11);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mem");
        let bs = 4096usize;
        // 600 blocks drawn from 40 patterns and zeros, and a partial tail.
        let patterns: Vec<Vec<u8>> = (0..40)
            .map(|_| (0..bs).map(|_| rng.r#gen::<u8>()).collect())
            .collect();
        let mut data = Vec::new();
        for _ in 0..600 {
            match rng.gen_range(0..50usize) {
                40.. => data.extend_from_slice(&vec![0u8; bs]),
                p => data.extend_from_slice(&patterns[p]),
            }
        }
        data.extend_from_slice(&patterns[0][..100]);
        std::fs::write(&path, &data).expect("write");
        let mut seen = Vec::new();
        let meta = scan(
            &path,
            4096,
            Actions::COMPRESS_AND_COPY,
            true,
            false,
            &mut |n| seen.push(n),
        )
        .expect("scan");
        meta.validate().expect("valid");
        // Progress covers both passes, in order, and ends at the whole.
        let work = scan_work(data.len() as u64, Actions::COMPRESS_AND_COPY, true, false);
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
        assert!(seen.contains(&(data.len() as u64)));
        assert_eq!(seen.last(), Some(&work));
        let plain = scan(
            &path,
            4096,
            Actions::COMPRESS_AND_COPY,
            false,
            false,
            &mut |n| assert!(n <= data.len() as u64, "one pass without repeats"),
        )
        .expect("scan");
        assert!(plain.repeats.is_empty());
        assert_eq!(plain.compressed_size, meta.compressed_size);
        // The model: each non-zero whole block repeats its first copy.
        let blocks: Vec<&[u8]> = data.chunks_exact(bs).collect();
        let mut want = Vec::new();
        for (b, block) in blocks.iter().enumerate() {
            if block.iter().all(|&x| x == 0) {
                continue;
            }
            let first = blocks.iter().position(|o| o == block).unwrap_or(b);
            if first < b {
                want.push((b as u64, first as u64));
            }
        }
        let got: Vec<(u64, u64)> = meta
            .repeats
            .iter()
            .flat_map(|r| (0..u64::from(r.len)).map(move |i| (r.to + i, r.from + i)))
            .collect();
        assert_eq!(got, want);
        assert!(meta.repeats.len() < want.len(), "neighbours make runs");
        let back = MetaFile::decode(&meta.encode()).expect("decode");
        assert_eq!(back, meta);
        // Without compress-and-copy nothing is looked for.
        let plain = scan(&path, 4096, Actions::default(), false, false, &mut |_| {}).expect("scan");
        assert!(plain.repeats.is_empty());
    }

    #[test]
    fn write_beside_is_decodable_and_leaves_the_file_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mem.vmss");
        std::fs::write(&path, vec![0u8; 10_000]).expect("write");
        let stat = |p: &Path| {
            let m = std::fs::metadata(p).expect("stat");
            (
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
            )
        };
        let before = stat(&path);
        let meta = scan(&path, 4096, Actions::default(), false, false, &mut |_| {}).expect("scan");
        let written = write_beside(&path, &meta).expect("write_beside");
        assert_eq!(written, dir.path().join(".mem.vmss.gvfsmeta"));
        assert_eq!(stat(&path), before);
        let bytes = std::fs::read(&written).expect("read");
        assert_eq!(MetaFile::decode(&bytes), Ok(meta.clone()));
        // Rewriting replaces it; no temporary file is left behind.
        write_beside(&path, &meta).expect("again");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("readdir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        // A metadata file cannot itself be described.
        let e = write_beside(&written, &meta).expect_err("meta of meta");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    /// `gvfsctl meta gen` run by root writes metadata its proxies trust,
    /// readable by whoever may read the file: the file's owner, group and
    /// permission bits.
    #[test]
    fn write_beside_gives_the_metadata_the_files_owner_and_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("user.img");
        std::fs::write(&path, vec![0u8; 8192]).expect("write");
        let meta = scan(&path, 4096, Actions::default(), false, false, &mut |_| {}).expect("scan");
        let as_root = std::os::unix::fs::chown(&path, Some(1234), Some(5678)).is_ok();
        for mode in [0o640, 0o664, 0o600] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let written = write_beside(&path, &meta).expect("write_beside");
            let (m, f) = (
                std::fs::metadata(&written).expect("stat"),
                std::fs::metadata(&path).expect("stat"),
            );
            if as_root {
                assert_eq!((m.uid(), m.gid()), (1234, 5678));
                assert_eq!(m.mode() & 0o7777, mode);
            }
            let own = |m: &std::fs::Metadata| crate::trust::Ownership {
                regular: m.is_file(),
                uid: m.uid(),
                gid: m.gid(),
                mode: m.mode(),
            };
            assert_eq!(crate::trust::check(&own(&m), &own(&f)), Ok(()), "{mode:o}");
        }
    }

    #[test]
    fn bad_inputs_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").expect("write");
        for bs in [0, 2048, 3 << 12, 2 << 20] {
            let e =
                scan(&path, bs, Actions::default(), false, false, &mut |_| {}).expect_err("bad bs");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        }
        let e = scan(
            dir.path(),
            4096,
            Actions::default(),
            false,
            false,
            &mut |_| {},
        )
        .expect_err("dir");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").expect("write");
        let m = scan(&empty, 4096, Actions::default(), false, false, &mut |_| {}).expect("empty");
        assert_eq!(m.zero.blocks(), 0);
        assert_eq!(
            MetaFile::decode(&m.encode()).map_err(|e: MetaError| e),
            Ok(m)
        );
    }
}
