//! gvfsctl meta: make and show `.NAME.gvfsmeta` files (runs locally; no
//! proxy needed).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Subcommand;
use serde_json::json;

use super::control::control_path;

#[derive(Debug, Subcommand)]
pub(super) enum MetaCmd {
    /// Scan files and write `.NAME.gvfsmeta` beside each (on the image
    /// server's directory, or through a proxy's mount).
    Gen {
        /// Regular files to scan; directories and metadata files are skipped.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Zero-map block size: a power of two from 4K to 1M.
        #[arg(long, default_value = "4K", value_name = "SIZE")]
        block_size: String,
        /// Mark the files compress-and-copy (fetched whole as one zstd
        /// stream into the proxy's file cache), and record their zstd size,
        /// the blocks that repeat earlier ones (sent once, not twice) and
        /// the hash of each block (copied from other images a proxy holds).
        #[arg(long)]
        compress: bool,
        /// With --compress, do not record repeated blocks: the file stays
        /// in metadata format 1, which proxies older than repeats read
        /// (with --no-hashes too).
        #[arg(long, requires = "compress")]
        no_repeats: bool,
        /// With --compress, do not record block hashes (a fingerprint of
        /// each non-zero block, 8 bytes, and a BLAKE3 hash of each 64 KiB,
        /// 32 bytes), by which proxies copy blocks an image shares with
        /// what they hold instead of fetching them: the file stays in
        /// metadata format 1 or 2, which proxies older than hashes read
        /// (they ignore a format 3 file and serve the image without
        /// metadata).
        #[arg(long, requires = "compress")]
        no_hashes: bool,
        /// Without --compress, record block hashes too (they are recorded
        /// with --compress unless --no-hashes): a proxy with a block cache
        /// then fills a block of the file (a disk image read block by
        /// block) from blocks with the same content it holds, instead of
        /// reading it upstream. Needs a --block-size of 64K or less.
        #[arg(long, conflicts_with_all = ["compress", "no_hashes"])]
        hashes: bool,
    },
    /// Print a metadata file, whether it still matches its file, and (with
    /// block hashes) how much of it a running proxy holds already.
    Show {
        /// The file, or its `.NAME.gvfsmeta`.
        path: PathBuf,
    },
}

/// `gvfsctl meta gen|show`: makes and prints metadata files.
pub(super) fn meta(cmd: MetaCmd, control: Option<PathBuf>) -> anyhow::Result<()> {
    match cmd {
        MetaCmd::Gen {
            paths,
            block_size,
            compress,
            no_repeats,
            no_hashes,
            hashes,
        } => {
            // Whole files get hashes unless told not to; files read block
            // by block only when asked.
            let hashes = if compress { !no_hashes } else { hashes };
            meta_gen(&paths, &block_size, compress, !no_repeats, hashes)
        }
        MetaCmd::Show { path } => meta_show(&path, control),
    }
}

pub(super) fn meta_gen(
    paths: &[PathBuf],
    block_size: &str,
    compress: bool,
    repeats: bool,
    hashes: bool,
) -> anyhow::Result<()> {
    let bs = gvfs_proxy::config::parse_size(block_size)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| {
            n.is_power_of_two()
                && (gvfs_metafile::MIN_BLOCK_SIZE..=gvfs_metafile::MAX_BLOCK_SIZE).contains(n)
        })
        .with_context(|| {
            format!("--block-size {block_size:?}: expected a power of two from 4K to 1M")
        })?;
    let actions = if compress {
        gvfs_metafile::Actions::COMPRESS_AND_COPY
    } else {
        gvfs_metafile::Actions::default()
    };
    // Pick the files first, so the progress bar knows the total.
    let files = files_to_scan(paths)?;
    let work = |size| gvfs_metafile::scan_work(size, actions, repeats, hashes);
    let bar = indicatif::ProgressBar::new(files.iter().map(|f| work(f.1)).sum());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let mut done = 0;
    let mut lines = Vec::new();
    for (path, size) in files {
        bar.set_message(path.display().to_string());
        let scanned = gvfs_metafile::scan(path, bs, actions, repeats, hashes, &mut |n| {
            bar.set_position(done + n)
        })
        .with_context(|| format!("scanning {}", path.display()))?;
        let written = gvfs_metafile::write_beside(path, &scanned)
            .with_context(|| format!("writing the metadata of {}", path.display()))?;
        if let Err(why) = trusted_beside(path, &written) {
            let _ = std::fs::remove_file(&written);
            bail!(
                "{}: proxies would not trust metadata written by this user ({why}); \
                 run `gvfsctl meta gen` as root or as the file's owner",
                path.display()
            );
        }
        done += work(size);
        bar.set_position(done);
        let mut line = format!(
            "{}: {}, {}",
            path.display(),
            indicatif::HumanBytes(scanned.file_size),
            zero_summary(&scanned)
        );
        if compress {
            line += &format!(
                ", {} repeat earlier blocks, zstd {}",
                indicatif::HumanBytes(scanned.repeat_bytes()),
                indicatif::HumanBytes(scanned.compressed_size)
            );
        }
        match &scanned.hashes {
            Some(h) => {
                line += &format!(
                    ", block hashes ({} block fingerprints, {} hashes of pieces not all zero)",
                    h.fingerprints().len(),
                    h.pieces().len()
                )
            }
            None if hashes && u64::from(bs) > gvfs_metafile::hashes::HASH_PIECE => {
                line += ", no block hashes (they need a --block-size of 64K or less)";
            }
            None if hashes => {
                line += &format!(
                    ", no block hashes (more than {} would take; a larger --block-size \
                     has fewer blocks)",
                    indicatif::HumanBytes(gvfs_metafile::MAX_META_LEN as u64)
                )
            }
            None => {}
        }
        line += &format!(" -> {}", written.display());
        lines.push(line);
    }
    bar.finish_and_clear();
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

/// Whether proxies trust the metadata file `meta` about `file`, by the
/// rule in `gvfs_meta::trust`, judged from the local attributes.
pub(super) fn trusted_beside(file: &Path, meta: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let own = |p: &Path| -> anyhow::Result<gvfs_metafile::trust::Ownership> {
        let m = std::fs::symlink_metadata(p).with_context(|| format!("{}", p.display()))?;
        Ok(gvfs_metafile::trust::Ownership {
            regular: m.is_file(),
            uid: m.uid(),
            gid: m.gid(),
            mode: m.mode(),
        })
    };
    gvfs_metafile::trust::check(&own(meta)?, &own(file)?)?;
    Ok(())
}

/// The regular files among `paths`, with their sizes; directories and
/// metadata files are skipped with a note, and it is an error if that
/// leaves nothing to scan.
pub(super) fn files_to_scan(paths: &[PathBuf]) -> anyhow::Result<Vec<(&PathBuf, u64)>> {
    let mut files = Vec::new();
    for path in paths {
        let md = std::fs::symlink_metadata(path).with_context(|| format!("{}", path.display()))?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if gvfs_metafile::is_meta_name(name) || name.ends_with(gvfs_metafile::META_SUFFIX) {
            eprintln!("gvfsctl: skipping {}: a metadata file", path.display());
        } else if !md.is_file() {
            eprintln!("gvfsctl: skipping {}: not a regular file", path.display());
        } else if gvfs_metafile::meta_name(name).is_none() {
            bail!(
                "{}: the name cannot have a metadata file (not UTF-8, or too long)",
                path.display()
            );
        } else {
            files.push((path, md.len()));
        }
    }
    if files.is_empty() {
        bail!(
            "no regular files to scan among {}; directories and metadata files are not \
             scanned (for the files in a directory, pass DIR/*)",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(files)
}

pub(super) fn zero_summary(m: &gvfs_metafile::MetaFile) -> String {
    let (zero, blocks) = (m.zero.zero_blocks(), m.zero.blocks());
    let pct = if blocks == 0 {
        0.0
    } else {
        zero as f64 * 100.0 / blocks as f64
    };
    format!(
        "{zero}/{blocks} zero {} blocks ({pct:.1}%)",
        indicatif::HumanBytes(u64::from(m.block_size))
    )
}

/// The file `path` names and its metadata file, given either; an error
/// that says which is missing when the metadata file is not there.
pub(super) fn meta_paths(path: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: no UTF-8 file name", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new(""));
    let (file, meta_path, meta) = match gvfs_metafile::described_name(name) {
        Some(described) => (dir.join(described), path.to_path_buf(), name.to_string()),
        None => {
            let m = gvfs_metafile::meta_name(name)
                .with_context(|| format!("{}: cannot have a metadata file", path.display()))?;
            (path.to_path_buf(), dir.join(&m), m)
        }
    };
    if std::fs::symlink_metadata(&meta_path).is_err() {
        if std::fs::symlink_metadata(&file).is_err() {
            bail!("{}: no such file", path.display());
        }
        bail!(
            "no metadata file {meta} beside {} (make one with `gvfsctl meta gen {}`)",
            file.display(),
            file.display()
        );
    }
    Ok((file, meta_path))
}

pub(super) fn meta_show(path: &Path, control: Option<PathBuf>) -> anyhow::Result<()> {
    let (file, meta_path) = meta_paths(path)?;
    let len = std::fs::metadata(&meta_path)
        .with_context(|| format!("{}", meta_path.display()))?
        .len();
    if len > gvfs_metafile::MAX_META_LEN as u64 {
        bail!(
            "{}: {len} bytes, over the {} byte limit for metadata files",
            meta_path.display(),
            gvfs_metafile::MAX_META_LEN
        );
    }
    let bytes = std::fs::read(&meta_path).with_context(|| format!("{}", meta_path.display()))?;
    let m = gvfs_metafile::MetaFile::decode(&bytes)
        .with_context(|| format!("{}", meta_path.display()))?;
    let a = m.actions;
    let actions: Vec<&str> = [
        (a.compress, "compress"),
        (a.remote_copy, "remote-copy"),
        (a.uncompress, "uncompress"),
        (a.read_locally, "read-locally"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, name)| *name)
    .collect();
    let time = |(s, ns): (u64, u32)| format!("{s}.{ns:09}");
    println!(
        "metadata:        {} ({} bytes)",
        meta_path.display(),
        bytes.len()
    );
    println!("file:            {}", file.display());
    println!(
        "size:            {} ({} bytes)",
        indicatif::HumanBytes(m.file_size),
        m.file_size
    );
    println!("mtime:           {}", time(m.mtime));
    println!("ctime:           {}", time(m.ctime));
    println!(
        "block size:      {}",
        indicatif::HumanBytes(u64::from(m.block_size))
    );
    println!("zero blocks:     {}", zero_summary(&m));
    println!("zero runs:       {}", m.zero.zero_ranges().len());
    println!(
        "repeated blocks: {} in {} runs (sent once by a whole-file fetch)",
        indicatif::HumanBytes(m.repeat_bytes()),
        m.repeats.len()
    );
    match &m.hashes {
        Some(h) => println!(
            "block hashes:    {} block fingerprints, {} hashes of pieces not all zero (BLAKE3: blocks shared \
             with other images are copied, not fetched)",
            h.fingerprints().len(),
            h.pieces().len()
        ),
        None => println!("block hashes:    none"),
    }
    println!(
        "actions:         {}",
        if actions.is_empty() {
            "none (zero map only)".to_string()
        } else {
            actions.join(", ")
        }
    );
    if m.compressed_size != 0 {
        println!(
            "zstd size:       {} ({:.1}% of the file)",
            indicatif::HumanBytes(m.compressed_size),
            m.compressed_size as f64 * 100.0 / m.file_size.max(1) as f64
        );
    }
    let state = match std::fs::metadata(&file) {
        Err(e) => format!("cannot check: {e}"),
        Ok(f) => {
            use std::os::unix::fs::MetadataExt;
            let t = |s: i64, ns: i64| {
                (
                    u64::try_from(s).unwrap_or(0),
                    ns.clamp(0, 999_999_999) as u32,
                )
            };
            let (mtime, ctime) = (t(f.mtime(), f.mtime_nsec()), t(f.ctime(), f.ctime_nsec()));
            let now = gvfs_nfs::FileVersion {
                size: f.len(),
                mtime,
                ctime,
            };
            if !m.file_version().same_but_ctime(&now) {
                format!(
                    "no: stale, the file is now {} bytes, mtime {} (a proxy ignores this \
                     metadata; regenerate it with `gvfsctl meta gen`)",
                    f.len(),
                    time(mtime)
                )
            } else if m.file_version() == now {
                "yes (size, mtime and ctime)".to_string()
            } else {
                format!(
                    "no: the file's ctime is now {} (changed, or its owner or mode were, with \
                     the mtime kept): a proxy ignores this metadata; regenerate it with \
                     `gvfsctl meta gen`",
                    time(ctime)
                )
            }
        }
    };
    println!("matches file:    {state}");
    let trusted = match trusted_beside(&file, &meta_path) {
        Ok(()) => "yes (written by root or the file's owner, no other writers)".to_string(),
        Err(why) => format!("no: {why:#} (a proxy ignores this metadata)"),
    };
    println!("trusted:         {trusted}");
    println!("working set:     {}", working_set(&file));
    if let Some(h) = &m.hashes {
        println!(
            "shared:          {}",
            shared(h.fingerprints(), m.block_size, control)
        );
    }
    Ok(())
}

/// How many of `hashes` the running proxy (at `control`, or the one found)
/// holds a block of: what a node would copy instead of fetch.
fn shared(hashes: &[gvfs_metafile::Fingerprint], bs: u32, control: Option<PathBuf>) -> String {
    let path = match control_path(control) {
        Ok(p) => p,
        Err(why) => return format!("no proxy asked ({why:#})"),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return format!("no proxy asked ({e})"),
    };
    let mut held = 0u64;
    for batch in hashes.chunks(gvfs_proxy::status::MAX_HELD_QUERY) {
        let hex: Vec<String> = batch
            .iter()
            .map(|h| h.iter().map(|b| format!("{b:02x}")).collect())
            .collect();
        let req = json!({ "cmd": "held_blocks", "hashes": hex });
        match runtime.block_on(gvfs_proxy::control::request(&path, &req)) {
            Ok(v) => held += v["held"].as_u64().unwrap_or(0),
            Err(e) => return format!("the proxy at {} did not say ({e})", path.display()),
        }
    }
    let total = hashes.len() as u64;
    format!(
        "{held} of {total} data blocks ({} of {}, {:.1}%) held by the proxy at {}: a fetch \
         copies them instead",
        indicatif::HumanBytes(held * u64::from(bs)),
        indicatif::HumanBytes(total * u64::from(bs)),
        held as f64 * 100.0 / total.max(1) as f64,
        path.display()
    )
}

/// What the `.NAME.gvfsprofile` beside `file` says: the working set lazy
/// clones of it learned.
fn working_set(file: &Path) -> String {
    let name = file.file_name().and_then(|n| n.to_str());
    let Some(pname) = name.and_then(gvfs_ext::profile::profile_name) else {
        return "none".into();
    };
    let path = file.with_file_name(&pname);
    let bytes = match std::fs::File::open(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return "none learned yet (a lazy clone through a gvfs-proxy learns it)".into();
        }
        Err(e) => return format!("{}: {e}", path.display()),
        Ok(f) => {
            use std::io::Read;
            let mut bytes = Vec::new();
            let limit = gvfs_ext::profile::MAX_PROFILE_LEN as u64 + 1;
            if let Err(e) = f.take(limit).read_to_end(&mut bytes) {
                return format!("{}: {e}", path.display());
            }
            bytes
        }
    };
    let Some(p) = gvfs_ext::Profile::from_record(&bytes) else {
        return format!("{pname} is damaged (ignored by proxies)");
    };
    let current = std::fs::metadata(file).ok().is_some_and(|m| {
        use std::os::unix::fs::MetadataExt;
        let t = |s: i64, ns: i64| (s as u32, ns as u32);
        m.len() == p.size
            && t(m.mtime(), m.mtime_nsec()) == p.mtime
            && t(m.ctime(), m.ctime_nsec()) == p.ctime
    });
    let first: Vec<String> = p
        .ranges()
        .take(8)
        .map(|(a, _)| indicatif::HumanBytes(a).to_string())
        .collect();
    format!(
        "{} in {} parts of {} (first touched at {}{}), in {pname}; {}",
        indicatif::HumanBytes(p.bytes()),
        p.parts.len(),
        indicatif::HumanBytes(u64::from(p.unit)),
        first.join(", "),
        if p.parts.len() > 8 { ", ..." } else { "" },
        if current {
            "learned on this version of the file"
        } else {
            "stale: learned on another version (proxies ignore it)"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_gen_with_nothing_to_scan_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("d");
        std::fs::create_dir(&sub).unwrap();
        let meta = dir.path().join(".disk.img.gvfsmeta");
        std::fs::write(&meta, b"").unwrap();
        let e = format!("{:#}", files_to_scan(&[sub.clone(), meta]).unwrap_err());
        assert!(e.starts_with("no regular files to scan among "), "{e}");
        assert!(e.contains(&sub.display().to_string()), "{e}");
        assert!(e.contains("pass DIR/*"), "{e}");
        let file = dir.path().join("disk.img");
        std::fs::write(&file, b"data").unwrap();
        let given = [sub, file.clone()];
        assert_eq!(files_to_scan(&given).unwrap(), vec![(&file, 4)]);
    }

    #[test]
    fn meta_show_says_which_file_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.img");
        let e = format!("{:#}", meta_paths(&file).unwrap_err());
        assert_eq!(e, format!("{}: no such file", file.display()));
        std::fs::write(&file, b"data").unwrap();
        let e = format!("{:#}", meta_paths(&file).unwrap_err());
        assert!(
            e.starts_with("no metadata file .disk.img.gvfsmeta beside "),
            "{e}"
        );
        assert!(e.contains("(make one with `gvfsctl meta gen "), "{e}");
        let meta = dir.path().join(".disk.img.gvfsmeta");
        let e = format!("{:#}", meta_paths(&meta).unwrap_err());
        assert!(e.starts_with("no metadata file .disk.img.gvfsmeta"), "{e}");
        std::fs::write(&meta, b"").unwrap();
        assert_eq!(meta_paths(&file).unwrap(), (file.clone(), meta.clone()));
        assert_eq!(meta_paths(&meta).unwrap(), (file, meta));
    }
}
