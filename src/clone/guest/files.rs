//! The files on a golden image's disk, shared with the other images like a
//! real fleet's: the same system files on every image (in the kernel's
//! page cache after boot, so in every memory image), each image's own
//! working set and data.
//!
//! - `sys/` ([`GoldenSize::system_mib`]): system files, the same bytes on
//!   every image, read at boot (they stay in the guest's page cache);
//! - `usr/` (the rest of [`GoldenSize::system_disk_mib`]): more system
//!   files, the same on every image, never read;
//! - `boot/` ([`GoldenSize::working_set_mib`]): the image's own working
//!   set, read at boot (it stays in the page cache) and for each request;
//! - `run/`: the image's own 32 files of 64 KiB, one read per tick;
//! - `data/` (the rest of [`GoldenSize::disk_files_mib`]): the image's own
//!   files, never read.
//!
//! Every 4 KiB page of a file is half pseudo-random bytes and half text
//! naming the file, and the image for its own files (`write_guest_file`):
//! it compresses about 2:1, as a VM's files and caches do, and no two pages
//! are alike unless they are the same page of the same shared file.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};

use super::limits::{MIB, TOOL_TIMEOUT};
use crate::data::fill_at;
use crate::process::run_ok;

/// The size of a golden image.
#[derive(Debug, Clone, Copy)]
pub struct GoldenSize {
    /// Guest RAM.
    pub ram_mib: u64,
    /// The image's own files the guest reads at boot (`boot/`; they stay in
    /// its page cache, so in the memory image) and for each request.
    pub working_set_mib: u64,
    /// System files the guest also reads at boot (`sys/`), the same bytes
    /// on every image: the part of each memory image that the others hold
    /// too, beside the kernel's own pages.
    pub system_mib: u64,
    /// All the system files on the disk, the same on every image: `sys/`
    /// and `usr/` (never read), at least `system_mib`.
    pub system_disk_mib: u64,
    /// All the files on the disk: the system files, the working set, and
    /// the image's own `data/` (never read) for the rest.
    pub disk_files_mib: u64,
}

impl GoldenSize {
    /// The image's own `data/`.
    fn data_mib(&self) -> u64 {
        self.disk_files_mib
            .saturating_sub(self.working_set_mib + self.system_disk_mib)
    }
}

/// Files in `run/`: the guest reads one per tick.
const RUN_FILES: u64 = 32;
const RUN_FILE_BYTES: u64 = 64 * 1024;
/// Size of each file in `boot/`, `sys/`, `usr/` and `data/`.
const FILE_BYTES: u64 = 4 * MIB;

/// Whose bytes a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// Image number `seed`'s own.
    Image(u64),
    /// Every image's: a system file.
    System,
}

/// Writes the disk's files for image `seed` under `root`; returns the MD5
/// of each `run/` file, and of the `boot/` files one after the other.
pub(super) fn write_disk_files(
    root: &Path,
    seed: u64,
    size: GoldenSize,
) -> Result<(Vec<String>, String)> {
    ensure!(
        size.system_disk_mib >= size.system_mib
            && size.disk_files_mib >= size.working_set_mib + size.system_disk_mib,
        "disk files of {} MiB cannot hold a working set of {} MiB and system files of {} MiB \
         ({} MiB read at boot)",
        size.disk_files_mib,
        size.working_set_mib,
        size.system_disk_mib,
        size.system_mib
    );
    let own = Owner::Image(seed);
    for (sub, owner, mib) in [
        ("sys", Owner::System, size.system_mib),
        ("usr", Owner::System, size.system_disk_mib - size.system_mib),
        ("boot", own, size.working_set_mib),
        ("data", own, size.data_mib()),
    ] {
        let dir = root.join(sub);
        std::fs::create_dir_all(&dir)?;
        let count = (mib * MIB).div_ceil(FILE_BYTES);
        for i in 0..count {
            let len = FILE_BYTES.min(mib * MIB - i * FILE_BYTES);
            write_guest_file(&dir.join(format!("{i}")), owner, sub, i, len)?;
        }
    }
    let run = root.join("run");
    std::fs::create_dir_all(&run)?;
    for i in 0..RUN_FILES {
        write_guest_file(&run.join(format!("{i}")), own, "run", i, RUN_FILE_BYTES)?;
    }
    let out = run_ok(
        Command::new("md5sum")
            .args((0..RUN_FILES).map(|i| i.to_string()))
            .current_dir(&run),
        TOOL_TIMEOUT,
    )?;
    let run_sums = out
        .stdout_text()
        .lines()
        .map(|l| {
            l.split_whitespace()
                .next()
                .map(str::to_owned)
                .context("md5sum output")
        })
        .collect::<Result<_>>()?;
    Ok((run_sums, concatenated_md5(&root.join("boot"))?))
}

/// The MD5 of the files in `dir` one after the other, in the byte order of
/// their names (as a shell's `*` lists them in the C locale).
fn concatenated_md5(dir: &Path) -> Result<String> {
    let mut names = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|e| Ok(e?.file_name()))
        .collect::<Result<Vec<_>>>()?;
    names.sort();
    ensure!(!names.is_empty(), "{} is empty", dir.display());
    let out = run_ok(
        Command::new("sh")
            .args(["-c", r#"cat -- "$@" | md5sum"#, "sh"])
            .args(&names)
            .current_dir(dir),
        TOOL_TIMEOUT,
    )?;
    out.stdout_text()
        .split_whitespace()
        .next()
        .map(str::to_owned)
        .context("md5sum output")
}

/// A file of the guest's disk, `kind/index`: each 4 KiB page is half
/// pseudo-random bytes and half text naming the file (and the image, when
/// the file is its own), so it compresses about 2:1, as a VM's files and
/// caches do. A system file has the same bytes on every image.
fn write_guest_file(path: &Path, owner: Owner, kind: &str, index: u64, len: u64) -> Result<()> {
    const PAGE: usize = 4096;
    let (stream, label) = match owner {
        Owner::Image(seed) => (
            seed.wrapping_mul(0x1000_0000_01b3)
                .wrapping_add(index)
                .wrapping_add(kind.len() as u64 * 0x9e37),
            format!("gvfs golden image {seed}, {kind}/{index}: "),
        ),
        // No image's seed comes near: images are numbered from 1.
        Owner::System => (
            0x5157_0000_0000_0000
                ^ (u64::from(kind.as_bytes().first().copied().unwrap_or(0)) << 40)
                ^ index,
            format!("gvfs system file {kind}/{index}: "),
        ),
    };
    let mut f = std::io::BufWriter::new(
        File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    let mut page = vec![0u8; PAGE];
    let mut at = 0;
    while at < len {
        fill_at(stream, at, &mut page[..PAGE / 2]);
        for (i, b) in page[PAGE / 2..].iter_mut().enumerate() {
            *b = label.as_bytes()[i % label.len()];
        }
        let n = (len - at).min(PAGE as u64) as usize;
        f.write_all(&page[..n])?;
        at += n as u64;
    }
    f.flush()
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(working_set_mib: u64, system_mib: u64, system_disk_mib: u64) -> GoldenSize {
        GoldenSize {
            ram_mib: 128,
            working_set_mib,
            system_mib,
            system_disk_mib,
            disk_files_mib: 16,
        }
    }

    #[test]
    fn system_files_are_the_same_on_every_image_and_the_rest_its_own() {
        let root = tempfile::tempdir().expect("tempdir");
        let (one, two) = (root.path().join("1"), root.path().join("2"));
        let s = size(4, 4, 8);
        let (runs1, boot1) = write_disk_files(&one, 1, s).expect("image 1");
        let (runs2, boot2) = write_disk_files(&two, 2, s).expect("image 2");
        assert_eq!(runs1.len(), RUN_FILES as usize);
        assert_ne!((&runs1, &boot1), (&runs2, &boot2));
        let read = |dir: &Path, f: &str| std::fs::read(dir.join(f)).expect(f);
        for f in ["sys/0", "usr/0"] {
            assert_eq!(read(&one, f), read(&two, f), "{f}");
            assert_eq!(read(&one, f).len() as u64, FILE_BYTES);
        }
        assert_ne!(read(&one, "sys/0"), read(&one, "usr/0"));
        for f in ["boot/0", "data/0", "run/0"] {
            assert_ne!(read(&one, f), read(&two, f), "{f}");
        }
        // 16 MiB: 4 of sys/, 4 of usr/, 4 of boot/, 4 of data/.
        for d in ["sys", "usr", "boot", "data"] {
            assert_eq!(std::fs::read_dir(one.join(d)).expect(d).count(), 1, "{d}");
        }
        let text = String::from_utf8_lossy(&read(&one, "sys/0")).into_owned();
        assert!(text.contains("gvfs system file sys/0: "));
        assert!(!text.contains("golden image"));
        // A disk too small for its parts is refused.
        assert!(write_disk_files(&root.path().join("3"), 3, size(8, 4, 12)).is_err());
        assert!(write_disk_files(&root.path().join("4"), 4, size(4, 8, 4)).is_err());
    }
}
