//! A census of the golden images: what their files hold at 4 KiB blocks,
//! what they share with each other, and the least a clone can move across
//! the WAN when its proxy copies the blocks it already holds from other
//! images instead of fetching them (dedup across images).
//!
//! For each image, in the order WAN-S2 clones them, and each of its files:
//! - **non-zero** blocks: zero blocks never cross (the zero map names
//!   them);
//! - **shared** blocks: the non-zero blocks whose bytes some *other* image
//!   holds too, in the same kind of file (the files a clone copies, `mem`
//!   and `state`, together; the disks among themselves), repeats counted;
//! - **new** blocks: those whose bytes are in no image cloned before it
//!   and not earlier in this image (in the order a clone copies its files).
//!   Summed over `mem` and `state`, they are the **dedup floor** of the
//!   WAN-S2 clone that brings the image: raw, and compressed with zstd at
//!   level 3, each 1 MiB chunk's new blocks together (the proxies send
//!   1 MiB chunks at level 3);
//! - the size of its metadata file (`.NAME.gvfsmeta`), which crosses the
//!   WAN with it: from format 3, an 8-byte fingerprint per non-zero block
//!   and a 32-byte BLAKE3 per 64 KiB piece (from format 4, per piece that
//!   is not all zero blocks).
//!
//! The disk is read by blocks, only what the guest touches, and its
//! metadata has no block hashes (they would cost more WAN bytes than the
//! little a guest reads of its disk saves: `docs/BENCHMARKS.md`), so its
//! blocks are not deduplicated: its census says what the images' disks
//! share, and is no part of the floor.
//!
//! Pure Rust over the files (BLAKE3 of each block, as `gvfsctl meta gen
//! --compress` records them); the copied files and the disks are counted
//! on two threads.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

use super::guest::{DISK, MEM, STATE};

/// The block the census counts in (the metadata files' and the proxies').
pub const BLOCK: usize = 4096;
/// The unit the proxies send a file in, compressed as one zstd frame.
pub const CHUNK: usize = 1 << 20;
/// The zstd level the proxies compress chunks at.
pub const ZSTD_LEVEL: i32 = 3;
/// The files a clone copies whole (after `vm.json`, which is tiny), in the
/// order it copies them.
pub const SENT: [&str; 2] = [MEM, STATE];
/// The file read by blocks.
pub const READ: [&str; 1] = [DISK];

const MIB: f64 = (1u64 << 20) as f64;

/// A block's content hash.
type Hash = [u8; 32];

/// One file of one image, as counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileCensus {
    /// Its name in the image's directory.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Blocks with a byte that is not zero.
    pub nonzero_blocks: u64,
    /// Of which blocks whose bytes another image holds too.
    pub shared_blocks: u64,
    /// Of which blocks whose bytes no image counted before holds, nor this
    /// one earlier.
    pub new_blocks: u64,
    /// Their bytes (a last, partial block counts its own length).
    pub new_bytes: u64,
    /// Their bytes compressed, each 1 MiB chunk's new blocks in one zstd
    /// frame at level 3 (files a clone copies only).
    pub new_zstd_bytes: Option<u64>,
    /// The size of its metadata file, when it has one.
    pub meta_bytes: Option<u64>,
}

impl FileCensus {
    /// Non-zero bytes, counting every block whole.
    pub fn nonzero_bytes(&self) -> u64 {
        self.nonzero_blocks * BLOCK as u64
    }

    /// Shared blocks over non-zero ones (0 for a file of zeros).
    pub fn shared_fraction(&self) -> f64 {
        if self.nonzero_blocks == 0 {
            0.0
        } else {
            self.shared_blocks as f64 / self.nonzero_blocks as f64
        }
    }

    /// The counts of `files` added up, named `name`.
    fn sum<'a>(name: &str, files: impl IntoIterator<Item = &'a FileCensus>) -> Self {
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        files.into_iter().fold(
            Self {
                name: name.to_owned(),
                ..Self::default()
            },
            |s, f| Self {
                name: s.name,
                size: s.size + f.size,
                nonzero_blocks: s.nonzero_blocks + f.nonzero_blocks,
                shared_blocks: s.shared_blocks + f.shared_blocks,
                new_blocks: s.new_blocks + f.new_blocks,
                new_bytes: s.new_bytes + f.new_bytes,
                new_zstd_bytes: add(s.new_zstd_bytes, f.new_zstd_bytes),
                meta_bytes: add(s.meta_bytes, f.meta_bytes),
            },
        )
    }
}

/// One image, as counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageCensus {
    /// Its number (1-based).
    pub image: usize,
    /// Its files: [`SENT`] then [`READ`].
    pub files: Vec<FileCensus>,
}

impl ImageCensus {
    /// The file named `name`.
    pub fn file(&self, name: &str) -> Option<&FileCensus> {
        self.files.iter().find(|f| f.name == name)
    }

    /// The files a clone copies ([`SENT`]) added up: their new bytes are
    /// the dedup floor of the clone that brings the image.
    pub fn sent(&self) -> FileCensus {
        FileCensus::sum(
            "sent",
            self.files
                .iter()
                .filter(|f| SENT.contains(&f.name.as_str())),
        )
    }

    /// Bytes of its metadata files (every file's that has one).
    pub fn meta_bytes(&self) -> u64 {
        self.files.iter().filter_map(|f| f.meta_bytes).sum()
    }
}

/// The census of a run's golden images.
#[derive(Debug, Clone, PartialEq)]
pub struct Census {
    /// The images, in the order they were counted (WAN-S2's).
    pub images: Vec<ImageCensus>,
    /// How long the count took, seconds.
    pub secs: f64,
}

/// Who holds a block's bytes: the first image counted that did, and
/// whether another one does too.
struct Holders {
    first: usize,
    shared: bool,
}

/// Counts `files` of each of `images` (number and directory, in the order
/// they are cloned) as one pool: a block is shared when another image's
/// files of the pool hold its bytes. Returns each image's counts, in
/// order; compresses new blocks when `compress`.
fn count_pool(
    images: &[(usize, PathBuf)],
    files: &[&str],
    compress: bool,
) -> Result<Vec<Vec<FileCensus>>> {
    let mut holders: HashMap<Hash, Holders> = HashMap::new();
    let mut counted = Vec::with_capacity(images.len());
    let mut hashes = Vec::with_capacity(images.len());
    for (i, (_, dir)) in images.iter().enumerate() {
        let mut image = Vec::with_capacity(files.len());
        let mut image_hashes = Vec::with_capacity(files.len());
        for name in files {
            let (census, list) = count_file(dir, name, i, &mut holders, compress)?;
            image.push(census);
            image_hashes.push(list);
        }
        counted.push(image);
        hashes.push(image_hashes);
    }
    for (image, image_hashes) in counted.iter_mut().zip(&hashes) {
        for (census, list) in image.iter_mut().zip(image_hashes) {
            census.shared_blocks = list
                .iter()
                .filter(|h| holders.get(*h).is_some_and(|o| o.shared))
                .count() as u64;
        }
    }
    Ok(counted)
}

/// Counts `dir/name` as image number `image` (0-based, in counting order)
/// against `holders`, which it adds its blocks to; returns its counts
/// (shared ones not yet) and its non-zero blocks' hashes in order.
fn count_file(
    dir: &Path,
    name: &str,
    image: usize,
    holders: &mut HashMap<Hash, Holders>,
    compress: bool,
) -> Result<(FileCensus, Vec<Hash>)> {
    let path = dir.join(name);
    let mut f = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let zeros = [0u8; BLOCK];
    let mut chunk = vec![0u8; CHUNK];
    let mut new = Vec::with_capacity(CHUNK);
    let mut census = FileCensus {
        name: name.to_owned(),
        new_zstd_bytes: compress.then_some(0),
        meta_bytes: std::fs::metadata(dir.join(format!(".{name}.gvfsmeta")))
            .ok()
            .map(|m| m.len()),
        ..FileCensus::default()
    };
    let mut list = Vec::new();
    loop {
        let n =
            read_full(&mut f, &mut chunk).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        census.size += n as u64;
        new.clear();
        for block in chunk[..n].chunks(BLOCK) {
            if block == &zeros[..block.len()] {
                continue;
            }
            census.nonzero_blocks += 1;
            let hash = *blake3::hash(block).as_bytes();
            list.push(hash);
            match holders.entry(hash) {
                Entry::Vacant(v) => {
                    v.insert(Holders {
                        first: image,
                        shared: false,
                    });
                    census.new_blocks += 1;
                    census.new_bytes += block.len() as u64;
                    if compress {
                        new.extend_from_slice(block);
                    }
                }
                Entry::Occupied(mut o) => {
                    let h = o.get_mut();
                    if h.first != image {
                        h.shared = true;
                    }
                }
            }
        }
        if let Some(z) = census.new_zstd_bytes.as_mut().filter(|_| !new.is_empty()) {
            *z += zstd::bulk::compress(&new, ZSTD_LEVEL)
                .context("zstd")?
                .len() as u64;
        }
        if n < CHUNK {
            break;
        }
    }
    Ok((census, list))
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl Census {
    /// Counts the golden images `images` (number and directory), given in
    /// the order WAN-S2 clones them, each once.
    pub fn take(images: &[(usize, PathBuf)]) -> Result<Self> {
        let start = Instant::now();
        let (sent, read) = std::thread::scope(|scope| {
            let read = scope.spawn(|| count_pool(images, &READ, false));
            let sent = count_pool(images, &SENT, true);
            let read = read
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the disk census panicked")));
            (sent, read)
        });
        let images = images
            .iter()
            .zip(sent?.into_iter().zip(read?))
            .map(|((image, _), (mut files, read))| {
                files.extend(read);
                ImageCensus {
                    image: *image,
                    files,
                }
            })
            .collect();
        Ok(Self {
            images,
            secs: start.elapsed().as_secs_f64(),
        })
    }

    /// The image numbered `image`.
    pub fn image(&self, image: usize) -> Option<&ImageCensus> {
        self.images.iter().find(|i| i.image == image)
    }

    /// The dedup floor of the clone that brings image `image`, compressed:
    /// the new bytes of its copied files, zstd -3 in 1 MiB chunks.
    pub fn floor_zstd(&self, image: usize) -> Option<u64> {
        self.image(image)?.sent().new_zstd_bytes
    }

    /// Each image's memory image: the fraction of its non-zero blocks no
    /// other image holds (its own), in counting order.
    pub fn own_memory(&self) -> Vec<f64> {
        self.images
            .iter()
            .filter_map(|i| i.file(MEM))
            .filter(|f| f.nonzero_blocks > 0)
            .map(|f| 1.0 - f.shared_fraction())
            .collect()
    }

    /// `clone-census.csv`: one line per image and file, in counting order;
    /// `clone` is the WAN-S2 clone that brings the image (its place in the
    /// order); empty cells where a count does not apply.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "clone,image,file,size_bytes,nonzero_blocks,shared_blocks,shared_fraction,\
             new_blocks,new_bytes,new_zstd_bytes,meta_bytes\n",
        );
        let opt = |x: Option<u64>| x.map(|x| x.to_string()).unwrap_or_default();
        for (k, image) in self.images.iter().enumerate() {
            for f in &image.files {
                // Writing to a String cannot fail.
                let _ = writeln!(
                    out,
                    "{},{},{},{},{},{},{:.4},{},{},{},{}",
                    k + 1,
                    image.image,
                    f.name,
                    f.size,
                    f.nonzero_blocks,
                    f.shared_blocks,
                    f.shared_fraction(),
                    f.new_blocks,
                    f.new_bytes,
                    opt(f.new_zstd_bytes),
                    opt(f.meta_bytes),
                );
            }
        }
        out
    }

    /// The report's section "Census of the golden images".
    pub fn markdown(&self) -> String {
        let mib = |b: u64| format!("{:.1}", b as f64 / MIB);
        let pct = |x: f64| format!("{:.0}%", 100.0 * x);
        let mut out = format!(
            "\n## Census of the golden images\n\n\
             The golden images at 4 KiB blocks (`src/clone/census.rs`, {:.1} s; every count in \
             `clone-census.csv`), in the order WAN-S2 clones them. For the memory image and the \
             device state (the files a clone copies): MiB of non-zero blocks, the part whose \
             bytes other images hold too (shared) and the part only this image holds (own); the \
             **dedup floor** of the WAN-S2 clone that brings the image: MiB of those two files \
             in no image cloned before and not earlier in this one, raw and compressed (zstd -3, \
             each 1 MiB chunk's new blocks together, as the proxies send chunks); its metadata \
             files, which cross the WAN with it (an 8-byte fingerprint per non-zero 4 KiB \
             block and a 32-byte BLAKE3 per 64 KiB piece not all zero of the files a clone copies); and the disk's non-zero MiB, shared part and new MiB \
             (the disk is read by blocks and its metadata has no block hashes, so its blocks \
             are not deduplicated: no part of the floor).\n\n\
             | WAN-S2 clone | image | memory non-zero MiB | shared | own | state non-zero MiB (shared) | floor MiB raw | floor MiB zstd | metadata KiB | disk non-zero MiB | disk shared | disk new MiB |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            self.secs
        );
        let none = FileCensus::default();
        for (k, image) in self.images.iter().enumerate() {
            let mem = image.file(MEM).unwrap_or(&none);
            let state = image.file(STATE).unwrap_or(&none);
            let disk = image.file(DISK).unwrap_or(&none);
            let sent = image.sent();
            out += &format!(
                "| {} | {} | {} | {} | {} | {:.2} ({}) | {} | {} | {:.0} | {} | {} | {} |\n",
                k + 1,
                image.image,
                mib(mem.nonzero_bytes()),
                pct(mem.shared_fraction()),
                pct(1.0 - mem.shared_fraction()),
                state.nonzero_bytes() as f64 / MIB,
                pct(state.shared_fraction()),
                mib(sent.new_bytes),
                sent.new_zstd_bytes.map_or("-".to_owned(), mib),
                image.meta_bytes() as f64 / 1024.0,
                mib(disk.nonzero_bytes()),
                pct(disk.shared_fraction()),
                mib(disk.new_bytes),
            );
        }
        let own = self.own_memory();
        if let (Some(lo), Some(hi)) = (
            own.iter().copied().reduce(f64::min),
            own.iter().copied().reduce(f64::max),
        ) {
            let range = if pct(lo) == pct(hi) {
                pct(lo)
            } else {
                format!("{}-{}", pct(lo), pct(hi))
            };
            out += &format!(
                "\nEach guest's memory image is {range} its own (mean {}): the rest of its \
                 non-zero blocks, the kernel's and the system files' pages among them, other \
                 images hold too.",
                pct(own.iter().sum::<f64>() / own.len() as f64)
            );
        }
        let floors: Vec<u64> = self
            .images
            .iter()
            .filter_map(|i| i.sent().new_zstd_bytes)
            .collect();
        if let [first, rest @ ..] = floors.as_slice()
            && !rest.is_empty()
            && *first > 0
        {
            let mean = rest.iter().sum::<u64>() as f64 / rest.len() as f64;
            let later = match floors.len() {
                2 => "clone 2".to_owned(),
                n => format!("clones 2-{n}"),
            };
            out += &format!(
                " The dedup floor of WAN-S2's {later} is {:.1} MiB compressed on average, \
                 {} of the first clone's {} MiB (everything new).",
                mean / MIB,
                pct(mean / *first as f64),
                mib(*first)
            );
        }
        out.push('\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block of `BLOCK` bytes: `byte`, then `tag` (so blocks of the same
    /// byte differ by tag).
    fn block(byte: u8, tag: u8) -> Vec<u8> {
        let mut b = vec![byte; BLOCK];
        b[BLOCK - 1] = tag;
        b
    }

    fn write(dir: &Path, name: &str, blocks: &[&[u8]]) {
        std::fs::create_dir_all(dir).expect("dir");
        std::fs::write(dir.join(name), blocks.concat()).expect("write");
    }

    #[test]
    fn census_counts_shared_new_and_compressed_blocks() {
        let root = tempfile::tempdir().expect("tempdir");
        let (a, b, c) = (block(1, 1), block(2, 2), block(3, 3));
        let (f, g, z) = (block(6, 6), block(7, 7), vec![0u8; BLOCK]);
        let (d, e, h) = (block(4, 4), block(5, 5), block(8, 8));
        let one = root.path().join("vm1");
        let two = root.path().join("vm2");
        write(&one, MEM, &[&a, &b, &z, &a, &c]);
        // A partial last block counts as one, and its own length.
        write(&one, STATE, &[&[9u8; 100]]);
        write(&one, DISK, &[&d, &e]);
        std::fs::write(one.join(".mem.gvfsmeta"), [0u8; 123]).expect("meta");
        write(&two, MEM, &[&a, &f, &z, &z, &f, &g]);
        // State of image 2 holds a block of image 1's memory.
        write(&two, STATE, &[&c]);
        write(&two, DISK, &[&d, &z, &h]);

        // Image 2 is cloned first.
        let census = Census::take(&[(2, two.clone()), (1, one.clone())]).expect("census");
        assert_eq!(
            census.images.iter().map(|i| i.image).collect::<Vec<_>>(),
            [2, 1]
        );
        let file = |image: usize, name: &str| {
            census
                .image(image)
                .and_then(|i| i.file(name))
                .cloned()
                .unwrap_or_else(|| panic!("no {name} of image {image}"))
        };
        let (mem2, state2, disk2) = (file(2, MEM), file(2, STATE), file(2, DISK));
        // a f f g non-zero; a shared with image 1; all of a f g new (first
        // image), the second f a repeat.
        assert_eq!(
            (mem2.size, mem2.nonzero_blocks, mem2.shared_blocks),
            (6 * BLOCK as u64, 4, 1)
        );
        assert_eq!((mem2.new_blocks, mem2.new_bytes), (3, 3 * BLOCK as u64));
        let frame = |blocks: &[&Vec<u8>]| {
            let raw: Vec<u8> = blocks.iter().flat_map(|b| b.iter().copied()).collect();
            zstd::bulk::compress(&raw, ZSTD_LEVEL).expect("zstd").len() as u64
        };
        assert_eq!(mem2.new_zstd_bytes, Some(frame(&[&a, &f, &g])));
        assert_eq!(mem2.meta_bytes, None);
        assert_eq!(
            (
                state2.nonzero_blocks,
                state2.shared_blocks,
                state2.new_blocks
            ),
            (1, 1, 1)
        );
        // Disks are their own pool, not compressed.
        assert_eq!(
            (disk2.nonzero_blocks, disk2.shared_blocks, disk2.new_blocks),
            (2, 1, 2)
        );
        assert_eq!(disk2.new_zstd_bytes, None);

        let (mem1, state1, disk1) = (file(1, MEM), file(1, STATE), file(1, DISK));
        // a b a c: a (twice) and c (image 2's state) shared; only b new.
        assert_eq!(
            (mem1.nonzero_blocks, mem1.shared_blocks, mem1.new_blocks),
            (4, 3, 1)
        );
        assert_eq!(mem1.new_zstd_bytes, Some(frame(&[&b])));
        assert_eq!(mem1.meta_bytes, Some(123));
        assert_eq!((state1.size, state1.nonzero_blocks), (100, 1));
        assert_eq!((state1.new_blocks, state1.new_bytes), (1, 100));
        assert_eq!((state1.shared_blocks, state1.shared_fraction()), (0, 0.0));
        assert_eq!(
            (disk1.nonzero_blocks, disk1.shared_blocks, disk1.new_blocks),
            (2, 1, 1)
        );

        // The floor: the copied files' new bytes.
        let sent1 = census.image(1).expect("image 1").sent();
        assert_eq!(sent1.new_bytes, BLOCK as u64 + 100);
        assert_eq!(
            census.floor_zstd(1),
            Some(frame(&[&b]) + frame(&[&vec![9u8; 100]]))
        );
        assert_eq!(census.own_memory(), [0.75, 0.25]);

        let csv = census.csv();
        assert_eq!(csv.lines().count(), 1 + 2 * 3);
        assert!(
            csv.lines().nth(1).expect("line").starts_with(&format!(
                "1,2,mem,{},4,1,0.2500,3,{},",
                6 * BLOCK,
                3 * BLOCK
            )),
            "{csv}"
        );
        assert!(
            csv.contains("\n2,1,disk.qcow2,8192,2,1,0.5000,1,4096,,\n"),
            "{csv}"
        );
        let md = census.markdown();
        assert!(md.contains("## Census of the golden images"), "{md}");
        assert!(
            md.contains("memory image is 25%-75% its own (mean 50%)"),
            "{md}"
        );
    }

    #[test]
    fn new_blocks_are_compressed_a_chunk_at_a_time() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("vm1");
        // A chunk and one block more, every block different.
        let per_chunk = CHUNK / BLOCK;
        let blocks: Vec<Vec<u8>> = (0..=per_chunk)
            .map(|i| crate::data::random_bytes(i as u64 + 1, BLOCK))
            .collect();
        let all: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
        write(&dir, MEM, &all);
        write(&dir, STATE, &[]);
        write(&dir, DISK, &[]);
        let census = Census::take(&[(1, dir)]).expect("census");
        let mem = census.image(1).and_then(|i| i.file(MEM)).expect("mem");
        let frame = |raw: &[u8]| zstd::bulk::compress(raw, ZSTD_LEVEL).expect("zstd").len() as u64;
        assert_eq!(mem.new_blocks, per_chunk as u64 + 1);
        assert_eq!(
            mem.new_zstd_bytes,
            Some(frame(&blocks[..per_chunk].concat()) + frame(&blocks[per_chunk]))
        );
        // One image shares nothing; an empty file counts nothing.
        assert_eq!(mem.shared_blocks, 0);
        let state = census.image(1).and_then(|i| i.file(STATE)).expect("state");
        assert_eq!(
            (state.size, state.nonzero_blocks, state.new_zstd_bytes),
            (0, 0, Some(0))
        );
        assert!(!census.markdown().contains("floor of WAN-S2's clones 2-"));
    }
}
