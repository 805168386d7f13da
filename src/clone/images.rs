//! The golden images of a run: built one per directory (`vm1`, `vm2`, ...)
//! with their metadata files, and counted ([`census`]) when there are two
//! or more to share anything.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, ensure};

use super::census::Census;
use super::guest::{self, DISK, GuestKit, MEM, STATE};
use super::scenario::{MIB, Scenario, Settings};
use crate::data::random_bytes_at;
use crate::proxy::gvfsctl_local;

/// The directory of golden image `image` (`vm1`, `vm2`, ...).
pub(super) fn image_dir(image: usize) -> String {
    format!("vm{image}")
}

/// Builds the golden images of `settings` in `root` (`vm1`, `vm2`, ...),
/// each with its metadata files (compress-and-copy with block hashes for
/// `mem` and `state`, a zero map for the disk).
///
/// With a busy scenario to run, one more: the busy guest's
/// ([`busy_image`]), built only then.
pub(super) fn build_images(kit: &GuestKit, root: &Path, settings: &Settings) -> Result<()> {
    let busy = busy_image(settings);
    for image in (1..=settings.images).chain(busy) {
        let dir = root.join(image_dir(image));
        let t = Instant::now();
        guest::build_golden(kit, &dir, image as u64, settings.size, Some(image) == busy)
            .with_context(|| format!("building golden image {image}"))?;
        for (file, compress) in [(MEM, true), (STATE, true), (DISK, false)] {
            let p = dir.join(file).display().to_string();
            let mut args = vec!["meta", "gen", p.as_str()];
            if compress {
                args.push("--compress");
            }
            gvfsctl_local(&args)?;
        }
        eprintln!(
            "golden image {image}: built in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The bulk file's name in the export.
pub(super) const BULK: &str = "bulk.raw";

/// Writes `bulk.raw` of `mib` MiB in `dir` (64 KiB runs, random and zero
/// in turn) and its metadata (`gvfsctl meta gen --compress`).
pub(super) fn write_bulk(dir: &Path, mib: u64) -> Result<()> {
    const RUN: u64 = 64 << 10;
    let path = dir.join(BULK);
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
    let zeros = vec![0u8; RUN as usize];
    for run in 0..(mib * MIB / RUN) {
        if run % 2 == 0 {
            f.write_all(&random_bytes_at(97, run * RUN, RUN as usize))?;
        } else {
            f.write_all(&zeros)?;
        }
    }
    f.flush()?;
    drop(f);
    gvfsctl_local(&["meta", "gen", &path.display().to_string(), "--compress"])?;
    Ok(())
}

/// The busy guest's image (the one after the others), when a busy scenario
/// runs.
pub(super) fn busy_image(settings: &Settings) -> Option<usize> {
    settings
        .scenarios
        .iter()
        .any(|s| matches!(s, Scenario::LazyBusy | Scenario::LazyBusyLearned))
        .then_some(settings.images + 1)
}

/// The images in the order WAN-S2 clones them (image 1 first), then any it
/// does not clone.
fn clone_order(settings: &Settings) -> Vec<usize> {
    let mut order: Vec<usize> = (0..settings.clones)
        .map(|i| (i % settings.images) + 1)
        .collect();
    order.extend(1..=settings.images);
    let mut seen = std::collections::BTreeSet::new();
    order.retain(|&i| seen.insert(i));
    order
}

/// The census of the golden images in `root` ([`census`]), when there are
/// two or more to share anything.
pub(super) fn take_census(root: &Path, settings: &Settings) -> Result<Option<Census>> {
    if settings.images < 2 {
        return Ok(None);
    }
    let images: Vec<(usize, PathBuf)> = clone_order(settings)
        .into_iter()
        .map(|i| (i, root.join(image_dir(i))))
        .collect();
    let census = Census::take(&images).context("the census of the golden images")?;
    eprintln!("census of the golden images: {:.1} s", census.secs);
    Ok(Some(census))
}

/// Builds the golden images of `settings` (in a temporary directory, no
/// NFS server, no proxy) and counts them ([`census`]); runs no scenario.
pub fn run_census(settings: &Settings) -> Result<Census> {
    ensure!(
        settings.images >= 2,
        "a census needs two images or more, to share anything"
    );
    let kit = GuestKit::prepare(&guest::kit_dir()).context("preparing the guest kit")?;
    let root = tempfile::Builder::new()
        .prefix("gvfs-census-")
        .tempdir()
        .context("a directory for the golden images")?;
    build_images(&kit, root.path(), settings)?;
    take_census(root.path(), settings)?.context("no census")
}

/// The size of `path` compressed as one zstd stream at level 3.
pub(super) fn zstd_size(path: &Path) -> Result<u64> {
    struct Count(u64);
    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut count = Count(0);
    zstd::stream::copy_encode(f, &mut count, 3).context("zstd")?;
    Ok(count.0)
}
