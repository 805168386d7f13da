//! Debian's kernel for the QEMU guests of the test suites: the package
//! fetched with `apt-get download` and unpacked with `dpkg-deb -x` (no root
//! needed), its modules found by name and put in load order from their own
//! `depends=` (Debian's package ships no modules.dep), and a `newc` writer
//! for the initramfs a guest boots from.
//!
//! Two kits are built from it: the clone benchmark's ([`crate::clone`]) and
//! the kernel NFS client suite's ([`crate::kernel`]). Each keeps its kernel and
//! initramfs under [`kit_dir`] and rebuilds them only when its stamp changes;
//! the package itself is kept in `KIT_DIR/debs`, so the second kit built on
//! a machine needs no download.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use crate::process::run_ok;

/// How long `apt-get download` or `dpkg-deb` may take.
const TOOL_TIMEOUT: Duration = Duration::from_secs(600);
/// The largest module file read whole (Debian's largest, amdgpu, is ~15 MB).
const MAX_MODULE_BYTES: u64 = 64 << 20;
/// What a download or unpack error says to do about it.
const HINT: &str = "fetching Debian's kernel package for the guest (needs apt-get with \
                    Debian's archive reachable, and dpkg-deb)";

/// The directory guest kits are kept in: `GVFS_GUEST_DIR`, else
/// `$CARGO_TARGET_DIR/gvfs-guest`, else `target/gvfs-guest` of the workspace.
pub fn kit_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("GVFS_GUEST_DIR") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("gvfs-guest")
}

/// Debian's kernel package, unpacked in a temporary directory (removed on
/// drop).
#[derive(Debug)]
pub struct KernelPackage {
    _unpacked: tempfile::TempDir,
    /// The kernel image (`boot/vmlinuz-*`).
    pub vmlinuz: PathBuf,
    /// Every `NAME.ko` of the package, by NAME (`-` read as `_`, as the
    /// kernel names modules).
    pub modules: BTreeMap<String, PathBuf>,
}

impl KernelPackage {
    /// Unpacks the package kept in `dir/debs`, downloading Debian's current
    /// `linux-image-amd64` kernel first when none is kept there. Several
    /// processes may call this at once: the download is done under a lock.
    pub fn fetch(dir: &Path) -> Result<Self> {
        let debs = dir.join("debs");
        std::fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
        let deb = {
            let _lock = DirLock::take(&debs)?;
            match kept_image_deb(&debs)? {
                Some(deb) => deb,
                None => download_image_deb(&debs)?,
            }
        };
        let unpacked = tempfile::Builder::new()
            .prefix("unpacked-")
            .tempdir_in(dir)
            .with_context(|| format!("creating a directory in {}", dir.display()))?;
        run_ok(
            Command::new("dpkg-deb")
                .arg("-x")
                .arg(&deb)
                .arg(unpacked.path()),
            TOOL_TIMEOUT,
        )
        .context(HINT)?;
        let vmlinuz = only_entry(&unpacked.path().join("boot"), "vmlinuz-")?;
        let tree = only_entry(&unpacked.path().join("lib/modules"), "")?.join("kernel");
        let modules = modules_by_name(&tree)?;
        ensure!(
            !modules.is_empty(),
            "no NAME.ko modules under {} ({} has compressed or no modules; the guests load \
             plain .ko files)",
            tree.display(),
            deb.display()
        );
        Ok(Self {
            _unpacked: unpacked,
            vmlinuz,
            modules,
        })
    }

    /// The file of module `name`.
    pub fn module(&self, name: &str) -> Result<&Path> {
        self.modules
            .get(name)
            .map(PathBuf::as_path)
            .with_context(|| format!("module {name}.ko is not in Debian's kernel package"))
    }

    /// `roots` and every module they depend on, each after its
    /// dependencies (read from each module's `depends=`).
    pub fn load_order(&self, roots: &[&str]) -> Result<Vec<String>> {
        load_order(roots, |name| module_depends(self.module(name)?))
    }
}

/// An exclusive `flock` on `dir/.lock`, held until dropped (a kit being
/// built by one process is not read or built again by another meanwhile).
pub(crate) struct DirLock {
    _file: File,
}

impl DirLock {
    /// Waits for the lock on `dir`.
    pub(crate) fn take(dir: &Path) -> Result<Self> {
        let path = dir.join(".lock");
        let f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        // SAFETY: flock on a descriptor we own; it stays open as long as
        // the lock is held.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("locking {}", path.display()));
        }
        Ok(Self { _file: f })
    }
}

/// The kernel image package kept in `debs`, if any (the newest by name).
fn kept_image_deb(debs: &Path) -> Result<Option<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(debs)
        .with_context(|| format!("reading {}", debs.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| is_image_deb(n) && !n.starts_with("linux-image-amd64_"))
        })
        .collect();
    found.sort();
    Ok(found.pop())
}

fn is_image_deb(name: &str) -> bool {
    name.starts_with("linux-image-") && name.ends_with(".deb")
}

/// Downloads `linux-image-amd64`, reads which kernel image it depends on,
/// downloads that into `debs` and returns its path.
fn download_image_deb(debs: &Path) -> Result<PathBuf> {
    let scratch = tempfile::Builder::new()
        .prefix("download-")
        .tempdir_in(debs)
        .with_context(|| format!("creating a directory in {}", debs.display()))?;
    let download = |name: &str| -> Result<PathBuf> {
        run_ok(
            Command::new("apt-get")
                .args(["download", "-q", name])
                .current_dir(scratch.path()),
            TOOL_TIMEOUT,
        )
        .with_context(|| format!("apt-get download {name}: {HINT}"))?;
        newest_deb(scratch.path(), name)
    };
    let meta = download("linux-image-amd64")?;
    let depends = run_ok(
        Command::new("dpkg-deb").arg("-f").arg(&meta).arg("Depends"),
        TOOL_TIMEOUT,
    )?
    .stdout_text();
    let image = depends
        .split(',')
        .map(|d| d.split_whitespace().next().unwrap_or(""))
        .find(|d| d.starts_with("linux-image-") && d != &"linux-image-amd64")
        .with_context(|| format!("no kernel image in Depends of linux-image-amd64: {depends}"))?
        .to_owned();
    let deb = download(&image)?;
    let kept = debs.join(deb.file_name().context("a .deb has a name")?);
    std::fs::rename(&deb, &kept).with_context(|| format!("keeping {}", kept.display()))?;
    Ok(kept)
}

/// The `.deb` of package `name` in `dir`.
fn newest_deb(dir: &Path, name: &str) -> Result<PathBuf> {
    let prefix = format!("{name}_");
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
        })
        .collect();
    found.sort();
    found.pop().with_context(|| {
        format!(
            "apt-get download left no {prefix}*.deb in {}",
            dir.display()
        )
    })
}

/// The one entry of `dir` whose name starts with `prefix` (the last by
/// name if there are several).
fn only_entry(dir: &Path, prefix: &str) -> Result<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    found.sort();
    found
        .pop()
        .with_context(|| format!("no {prefix}* in {}", dir.display()))
}

/// Every `NAME.ko` under `dir`, by NAME with `-` read as `_`.
fn modules_by_name(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut found = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Some(name) = path.file_name().and_then(|n| n.to_str())
                && let Some(stem) = name.strip_suffix(".ko")
            {
                found.insert(stem.replace('-', "_"), path.clone());
            }
        }
    }
    Ok(found)
}

/// The busybox binary to put in an initramfs (it must be static).
pub fn busybox() -> Result<&'static Path> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .context("no busybox (apt-get install busybox-static)")
}

/// The modules the module at `path` depends on, from the `depends=` entry
/// of its `.modinfo` section.
pub fn module_depends(path: &Path) -> Result<Vec<String>> {
    let mut bytes = Vec::new();
    File::open(path)
        .with_context(|| format!("opening {}", path.display()))?
        .take(MAX_MODULE_BYTES)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    let info = elf_section(&bytes, ".modinfo")
        .with_context(|| format!("reading the .modinfo section of {}", path.display()))?;
    Ok(modinfo_depends(info))
}

/// The names in the `depends=` entry of a `.modinfo` section (NUL-separated
/// `key=value` strings).
fn modinfo_depends(info: &[u8]) -> Vec<String> {
    info.split(|&b| b == 0)
        .filter_map(|entry| entry.strip_prefix(b"depends="))
        .flat_map(|list| list.split(|&b| b == b','))
        .filter(|name| !name.is_empty())
        .map(|name| String::from_utf8_lossy(name).replace('-', "_"))
        .collect()
}

/// The contents of the section called `name` in a 64-bit little-endian ELF
/// file (the ELF-64 object file format: header, section headers at
/// `e_shoff`, section names in the section `e_shstrndx`). Every offset is
/// checked against the file's length.
fn elf_section<'a>(elf: &'a [u8], name: &str) -> Result<&'a [u8]> {
    ensure!(elf.starts_with(b"\x7fELF"), "not an ELF file");
    ensure!(
        elf.get(4) == Some(&2) && elf.get(5) == Some(&1),
        "not a 64-bit little-endian ELF file"
    );
    let shoff = read_u64(elf, 0x28)?;
    let shentsize = u64::from(read_u16(elf, 0x3a)?);
    let shnum = u64::from(read_u16(elf, 0x3c)?);
    let shstrndx = u64::from(read_u16(elf, 0x3e)?);
    ensure!(shentsize >= 64, "section headers of {shentsize} bytes");
    // Section header: name u32 @0, type u32 @4, flags u64 @8, addr u64 @16,
    // offset u64 @24, size u64 @32, ...
    let header = |i: u64| -> Result<(u32, &'a [u8])> {
        let at = shoff
            .checked_add(i.checked_mul(shentsize).context("section header offset")?)
            .context("section header offset")?;
        let at = usize::try_from(at).context("section header offset")?;
        let end = usize::try_from(shentsize).context("section header size")?;
        ensure!(
            at.checked_add(end).is_some_and(|e| e <= elf.len()),
            "a section header lies past the end of the file"
        );
        let name = read_u32(elf, at)?;
        let offset = read_u64(elf, at + 24)?;
        let size = read_u64(elf, at + 32)?;
        let data = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(size).ok())
            .and_then(|(o, s)| elf.get(o..o.checked_add(s)?))
            .context("a section lies past the end of the file")?;
        Ok((name, data))
    };
    let (_, names) = header(shstrndx)?;
    for i in 0..shnum {
        let (at, data) = header(i)?;
        let at = usize::try_from(at).context("section name offset")?;
        let rest = names
            .get(at..)
            .context("a section name lies outside its table")?;
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        if &rest[..end] == name.as_bytes() {
            return Ok(data);
        }
    }
    bail!("no {name} section")
}

fn read_u16(b: &[u8], at: usize) -> Result<u16> {
    let s = b.get(at..at + 2).context("ELF file too short")?;
    Ok(u16::from_le_bytes([s[0], s[1]]))
}

fn read_u32(b: &[u8], at: usize) -> Result<u32> {
    let s = b.get(at..at + 4).context("ELF file too short")?;
    Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn read_u64(b: &[u8], at: usize) -> Result<u64> {
    let s = b.get(at..at + 8).context("ELF file too short")?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_le_bytes(a))
}

/// `roots` and everything they depend on (by `depends_of`), each after its
/// dependencies; dependencies are visited in the order listed, roots in the
/// order given. A cycle is an error.
fn load_order(
    roots: &[&str],
    mut depends_of: impl FnMut(&str) -> Result<Vec<String>>,
) -> Result<Vec<String>> {
    let mut order = Vec::new();
    let mut done = BTreeSet::new();
    for root in roots {
        // Depth-first, with the path so far to catch a cycle.
        let mut path: Vec<(String, Vec<String>)> = Vec::new();
        if done.contains(*root) {
            continue;
        }
        path.push(((*root).to_owned(), depends_of(root)?));
        while let Some((name, pending)) = path.last_mut() {
            match pending.first().cloned() {
                Some(dep) => {
                    pending.remove(0);
                    if done.contains(&dep) {
                        continue;
                    }
                    if path.iter().any(|(n, _)| *n == dep) {
                        let names: Vec<&str> = path.iter().map(|(n, _)| n.as_str()).collect();
                        bail!(
                            "modules depend on each other: {} -> {dep}",
                            names.join(" -> ")
                        );
                    }
                    let deps = depends_of(&dep)?;
                    path.push((dep, deps));
                }
                None => {
                    let name = name.clone();
                    path.pop();
                    done.insert(name.clone());
                    order.push(name);
                }
            }
        }
    }
    Ok(order)
}

/// A `newc` (SVR4, no CRC) cpio archive, as the kernel unpacks an initramfs.
#[derive(Default)]
pub struct Newc {
    out: Vec<u8>,
    ino: u32,
}

impl Newc {
    /// A directory (mode 0755).
    pub fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, 0, &[]);
    }

    /// A regular file with permissions `perm`.
    pub fn file(&mut self, name: &str, perm: u32, data: Vec<u8>) {
        self.entry(name, 0o100_000 | perm, 0, &data);
    }

    /// A character device node.
    pub fn char_device(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020_600, (major << 8) | minor, &[]);
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: u32, data: &[u8]) {
        self.ino += 1;
        let (rmaj, rmin) = (rdev >> 8, rdev & 0xff);
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            u32::try_from(data.len()).unwrap_or(u32::MAX),
            0,
            0,
            rmaj,
            rmin,
            u32::try_from(name.len() + 1).unwrap_or(u32::MAX),
            0,
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    /// The archive, with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, 0, &[]);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_archive_is_aligned_and_ends_with_a_trailer() {
        let mut c = Newc::default();
        c.dir("bin");
        c.file("init", 0o755, b"#!/bin/sh\n".to_vec());
        c.char_device("dev/console", 5, 1);
        let out = c.finish();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("TRAILER!!!"));
        // The console's device numbers are in the header fields.
        let at = text.find("dev/console").expect("entry");
        let header = &text[at - 110..at];
        assert_eq!(&header[78..86], "00000005");
        assert_eq!(&header[86..94], "00000001");
    }

    /// A minimal ELF-64 file: the header, then the section name table and
    /// a `.modinfo` section, then three section headers (null, names,
    /// modinfo).
    fn elf_with_modinfo(modinfo: &[u8]) -> Vec<u8> {
        let names = b"\0.shstrtab\0.modinfo\0";
        let names_at = 64u64;
        let info_at = names_at + names.len() as u64;
        let shoff = info_at + modinfo.len() as u64;
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        elf.extend_from_slice(names);
        elf.extend_from_slice(modinfo);
        for (name, at, size) in [
            (0u32, 0u64, 0u64),
            (1, names_at, names.len() as u64),
            (11, info_at, modinfo.len() as u64),
        ] {
            let mut sh = vec![0u8; 64];
            sh[..4].copy_from_slice(&name.to_le_bytes());
            sh[24..32].copy_from_slice(&at.to_le_bytes());
            sh[32..40].copy_from_slice(&size.to_le_bytes());
            elf.extend_from_slice(&sh);
        }
        elf
    }

    #[test]
    fn depends_are_read_from_the_modinfo_section() {
        let elf = elf_with_modinfo(b"license=GPL\0depends=sunrpc,fscache,lockd\0name=nfs\0");
        let info = elf_section(&elf, ".modinfo").expect("section");
        assert_eq!(modinfo_depends(info), ["sunrpc", "fscache", "lockd"]);
        let none = elf_with_modinfo(b"depends=\0name=grace\0");
        let info = elf_section(&none, ".modinfo").expect("section");
        assert!(modinfo_depends(info).is_empty());
        assert!(elf_section(&elf, ".text").is_err());
    }

    #[test]
    fn a_damaged_elf_file_is_an_error_not_a_panic() {
        let elf = elf_with_modinfo(b"depends=a\0");
        for cut in [0, 3, 20, 63, 64, 80, elf.len() - 1] {
            assert!(
                elf_section(&elf[..cut], ".modinfo").is_err(),
                "cut at {cut}"
            );
        }
        let mut far = elf.clone();
        far[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(elf_section(&far, ".modinfo").is_err());
        let mut big = elf;
        let last = big.len() - 64;
        big[last + 32..last + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(elf_section(&big, ".modinfo").is_err());
    }

    fn deps(table: &[(&str, &[&str])]) -> impl FnMut(&str) -> Result<Vec<String>> {
        let table: BTreeMap<String, Vec<String>> = table
            .iter()
            .map(|(n, d)| (n.to_string(), d.iter().map(|s| s.to_string()).collect()))
            .collect();
        move |name| {
            table
                .get(name)
                .cloned()
                .with_context(|| format!("no module {name}"))
        }
    }

    #[test]
    fn modules_load_after_what_they_depend_on() {
        // Debian 12's NFS client and virtio network chain, as read from
        // the modules.
        let table: &[(&str, &[&str])] = &[
            ("virtio_net", &["virtio_ring", "virtio", "net_failover"]),
            (
                "virtio_pci",
                &[
                    "virtio_ring",
                    "virtio_pci_modern_dev",
                    "virtio_pci_legacy_dev",
                    "virtio",
                ],
            ),
            ("nfsv3", &["nfs", "lockd", "sunrpc", "nfs_acl"]),
            ("nfs", &["sunrpc", "fscache", "lockd"]),
            ("lockd", &["sunrpc", "grace"]),
            ("nfs_acl", &["sunrpc"]),
            ("fscache", &["netfs"]),
            ("net_failover", &["failover"]),
            ("virtio", &["virtio_ring"]),
            ("sunrpc", &[]),
            ("grace", &[]),
            ("netfs", &[]),
            ("failover", &[]),
            ("virtio_ring", &[]),
            ("virtio_pci_modern_dev", &[]),
            ("virtio_pci_legacy_dev", &[]),
        ];
        let order = load_order(&["virtio_pci", "virtio_net", "nfsv3"], deps(table)).expect("order");
        assert_eq!(order.len(), table.len(), "{order:?}");
        let at = |m: &str| order.iter().position(|o| o == m).expect(m);
        for (module, needs) in table {
            for dep in *needs {
                assert!(at(dep) < at(module), "{dep} after {module} in {order:?}");
            }
        }
    }

    #[test]
    fn a_cycle_or_a_missing_module_is_an_error() {
        let cycle: &[(&str, &[&str])] = &[("a", &["b"]), ("b", &["c"]), ("c", &["a"])];
        let err = load_order(&["a"], deps(cycle)).expect_err("cycle");
        assert!(err.to_string().contains("a -> b -> c -> a"), "{err}");
        let missing: &[(&str, &[&str])] = &[("a", &["gone"])];
        let err = load_order(&["a"], deps(missing)).expect_err("missing");
        assert!(err.to_string().contains("gone"), "{err}");
    }
}
