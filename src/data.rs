//! Deterministic test data and file comparison.
//!
//! Content is a function of `(seed, offset)`: the 8-byte word at offset
//! `8 * i` is `splitmix64(seed, i)` in little-endian. Any byte range can
//! therefore be generated (or checked) on its own, without the bytes before
//! it, which is what tests of partial reads, writes at offsets and sparse
//! files need. It is not cryptographic and compresses like random data.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// A mebibyte.
pub const MIB: usize = 1 << 20;

/// Chunk size for streaming writes and comparisons.
const CHUNK: usize = 1 << 20;

/// SplitMix64 of word `index` under `seed` (Steele, Lea, Flood 2014).
fn word(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the content for `seed` starting at byte `offset`.
pub fn fill_at(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut pos = offset;
    let mut i = 0;
    while i < buf.len() {
        let w = word(seed, pos / 8).to_le_bytes();
        let start = (pos % 8) as usize;
        let n = (8 - start).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&w[start..start + n]);
        i += n;
        pos += n as u64;
    }
}

/// `len` bytes of content for `seed` from offset 0.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    random_bytes_at(seed, 0, len)
}

/// `len` bytes of content for `seed` starting at `offset`.
pub fn random_bytes_at(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    fill_at(seed, offset, &mut buf);
    buf
}

/// Creates (or truncates) `path` with `len` bytes of content for `seed`.
pub fn write_random_file(path: &Path, seed: u64, len: u64) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    write_random_range(&mut f, seed, 0, len)
        .with_context(|| format!("writing {}", path.display()))?;
    f.sync_all()
        .with_context(|| format!("syncing {}", path.display()))
}

/// Writes the content for `seed` over `[offset, offset + len)` of `f`.
fn write_random_range(f: &mut File, seed: u64, offset: u64, len: u64) -> Result<()> {
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        fill_at(seed, offset + done, &mut buf[..n]);
        f.write_all(&buf[..n])?;
        done += n as u64;
    }
    Ok(())
}

/// Creates (or truncates) `path` as a sparse file of `size` bytes whose
/// only data are the `extents` `(offset, len)`, filled with the content for
/// `seed` at those offsets; everything else is a hole.
///
/// Extents may reach past `size` (the file then grows to their end).
pub fn write_sparse_file(path: &Path, size: u64, seed: u64, extents: &[(u64, u64)]) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.set_len(size)?;
    for &(offset, len) in extents {
        write_random_range(&mut f, seed, offset, len)
            .with_context(|| format!("writing {} at {offset}", path.display()))?;
    }
    f.sync_all()
        .with_context(|| format!("syncing {}", path.display()))
}

/// Creates (or truncates) `path` as a sparse file of `size` bytes with each
/// `(offset, bytes)` written at its offset.
pub fn write_sparse_chunks(path: &Path, size: u64, chunks: &[(u64, &[u8])]) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.set_len(size)?;
    for &(offset, bytes) in chunks {
        f.seek(SeekFrom::Start(offset))?;
        f.write_all(bytes)
            .with_context(|| format!("writing {} at {offset}", path.display()))?;
    }
    f.sync_all()
        .with_context(|| format!("syncing {}", path.display()))
}

/// Creates (or truncates) `path` as something like a raw VM memory image of
/// `size` bytes: zero 4 KiB pages, in runs, make up about 60% (holes), and
/// each other page is half random bytes, half a repeated text (so it
/// compresses about 2:1, as guest RAM does).
pub fn write_memory_image(path: &Path, size: u64, seed: u64) -> Result<()> {
    const PAGE: u64 = 4096;
    const REGION: u64 = 64 * 1024;
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.set_len(size)?;
    let text = b"gvfs guest page: kernel text, page tables, caches. ";
    let mut page = vec![0u8; PAGE as usize];
    let mut region = 0;
    while region * REGION < size {
        let dice = word(seed ^ 0x5eed, region) % 100;
        region += 1;
        if dice < 55 {
            continue;
        }
        for p in 0..REGION / PAGE {
            let at = (region - 1) * REGION + p * PAGE;
            if at >= size || word(seed ^ 0xface, at / PAGE).is_multiple_of(10) {
                continue;
            }
            let half = (PAGE / 2) as usize;
            fill_at(seed, at, &mut page[..half]);
            for (i, b) in page[half..].iter_mut().enumerate() {
                *b = text[i % text.len()];
            }
            let n = (size - at).min(PAGE) as usize;
            f.seek(SeekFrom::Start(at))?;
            f.write_all(&page[..n])
                .with_context(|| format!("writing {} at {at}", path.display()))?;
        }
    }
    f.sync_all()
        .with_context(|| format!("syncing {}", path.display()))
}

/// Writes `bytes` at `offset` of an existing file (it grows if needed).
pub fn write_at(path: &Path, offset: u64, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.seek(SeekFrom::Start(offset))?;
    f.write_all(bytes)
        .with_context(|| format!("writing {} at {offset}", path.display()))
}

/// Bytes of disk actually allocated to `path` (`st_blocks * 512`): smaller
/// than the length for a sparse file.
pub fn allocated_bytes(path: &Path) -> Result<u64> {
    let meta = fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
    Ok(meta.blocks() * 512)
}

/// Checks that `actual` equals `expected`; the error names the first
/// differing offset (or the length mismatch) and shows bytes around it.
pub fn compare_bytes(expected: &[u8], actual: &[u8]) -> Result<()> {
    if let Some(off) = first_difference(expected, actual) {
        bail!(
            "contents differ at offset {off} (expected {} bytes, got {}): expected {}, got {}",
            expected.len(),
            actual.len(),
            hex_window(expected, off),
            hex_window(actual, off)
        );
    }
    Ok(())
}

/// Checks that the file at `actual` holds exactly `expected`.
pub fn compare_file_with(expected: &[u8], actual: &Path) -> Result<()> {
    let bytes = fs::read(actual).with_context(|| format!("reading {}", actual.display()))?;
    compare_bytes(expected, &bytes)
        .with_context(|| format!("{} differs from the expected bytes", actual.display()))
}

/// Checks that two files are identical, streaming both; the error names the
/// first differing offset.
pub fn compare_files(a: &Path, b: &Path) -> Result<()> {
    let open = |p: &Path| -> Result<BufReader<File>> {
        let f = File::open(p).with_context(|| format!("opening {}", p.display()))?;
        Ok(BufReader::with_capacity(CHUNK, f))
    };
    let (mut ra, mut rb) = (open(a)?, open(b)?);
    let mut ba = vec![0u8; CHUNK];
    let mut bb = vec![0u8; CHUNK];
    let mut offset = 0u64;
    loop {
        let na = read_full(&mut ra, &mut ba).with_context(|| format!("reading {}", a.display()))?;
        let nb = read_full(&mut rb, &mut bb).with_context(|| format!("reading {}", b.display()))?;
        if let Some(i) = first_difference(&ba[..na], &bb[..nb]) {
            let at = offset + i as u64;
            let what = if i == na.min(nb) {
                let (la, lb) = (file_len(a), file_len(b));
                format!("one ends first (lengths {la} and {lb})")
            } else {
                format!(
                    "{} vs {}",
                    hex_window(&ba[..na], i),
                    hex_window(&bb[..nb], i)
                )
            };
            bail!(
                "{} and {} differ at offset {at}: {what}",
                a.display(),
                b.display()
            );
        }
        if na == 0 {
            return Ok(());
        }
        offset += na as u64;
    }
}

/// Panics with [`compare_files`]' message when the files differ.
#[track_caller]
pub fn assert_files_equal(a: &Path, b: &Path) {
    if let Err(e) = compare_files(a, b) {
        panic!("{e:#}");
    }
}

/// Panics with [`compare_bytes`]' message when the bytes differ.
#[track_caller]
pub fn assert_bytes_equal(expected: &[u8], actual: &[u8]) {
    if let Err(e) = compare_bytes(expected, actual) {
        panic!("{e:#}");
    }
}

fn file_len(p: &Path) -> String {
    fs::metadata(p).map_or_else(|_| "?".to_owned(), |m| m.len().to_string())
}

/// Reads until `buf` is full or the input ends.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Index of the first byte where `a` and `b` differ, counting a length
/// mismatch as a difference at the shorter length.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    let common = a.len().min(b.len());
    // Compare in large blocks first (memcmp), then find the byte.
    let mut start = 0;
    while start < common {
        let end = (start + 4096).min(common);
        if a[start..end] != b[start..end] {
            return (start..end).find(|&i| a[i] != b[i]);
        }
        start = end;
    }
    (a.len() != b.len()).then_some(common)
}

/// Up to 8 bytes from `off`, in hex, or `<end>` past the end.
fn hex_window(bytes: &[u8], off: usize) -> String {
    let window = bytes.get(off..(off + 8).min(bytes.len())).unwrap_or(&[]);
    if window.is_empty() {
        return "<end>".to_owned();
    }
    window
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_position_addressable() {
        let whole = random_bytes(7, 1000);
        for (off, len) in [(0, 1), (3, 17), (8, 8), (13, 500), (999, 1)] {
            assert_eq!(random_bytes_at(7, off as u64, len), &whole[off..off + len]);
        }
        assert_ne!(random_bytes(8, 64), random_bytes(7, 64));
    }

    #[test]
    fn first_difference_finds_offsets_and_lengths() {
        let a = random_bytes(1, 10_000);
        let mut b = a.clone();
        assert_eq!(first_difference(&a, &b), None);
        b[9_000] ^= 1;
        assert_eq!(first_difference(&a, &b), Some(9_000));
        assert_eq!(first_difference(&a, &a[..5]), Some(5));
        let msg = format!(
            "{:#}",
            compare_bytes(&a, &b)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        );
        assert!(msg.contains("offset 9000"), "{msg}");
    }

    #[test]
    fn files_compare_and_sparse_files_have_holes() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        write_sparse_file(&a, 64 << 20, 3, &[(0, 4096), (32 << 20, 10_000)])?;
        assert_eq!(fs::metadata(&a)?.len(), 64 << 20);
        assert!(allocated_bytes(&a)? < 16 << 20);
        fs::copy(&a, &b)?;
        compare_files(&a, &b)?;
        write_at(&b, (32 << 20) + 5, b"x")?;
        let err = compare_files(&a, &b)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(&format!("offset {}", (32 << 20) + 5)), "{err}");
        let bytes = fs::read(&a)?;
        assert_eq!(
            &bytes[(32 << 20)..(32 << 20) + 10],
            &random_bytes_at(3, 32 << 20, 10)[..]
        );
        Ok(())
    }
}
