//! QEMU images on the FUSE mount (`gvfs-proxy --mount DIR`): a qcow2
//! made, checked and written by `qemu-img` and `qemu-io`, and a raw memory
//! image converted in and mapped privately, each compared through the
//! mount and at the origin.
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; the tests run as root, as the CI does.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::ProxyArgs;
use gvfs_testbed::data::{MIB, compare_bytes, compare_files};
use gvfs_testbed::fuse::{self, Mapping, MountPoint, TOOL_TIMEOUT, drop_caches, mounted};
use gvfs_testbed::libnfs::qemu_img;
use gvfs_testbed::process::run_ok;
use gvfs_testbed::require_fuse;

#[test]
fn qemu_images_on_the_mount() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let local = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    let disk = mnt.path().join("disk.qcow2");
    let disk_s = disk.display().to_string();
    let inner = || -> Result<()> {
        qemu_img(&["create", "-f", "qcow2", &disk_s, "64M"])?;
        qemu_img(&["check", &disk_s])?;
        // What the image should hold: 1 MiB of 0xab, then zeros.
        let expected = local.path().join("expected.raw");
        let f = File::create(&expected)?;
        f.set_len(64 * MIB as u64)?;
        f.write_all_at(&vec![0xab; MIB], 0)?;
        drop(f);
        let expected_s = expected.display().to_string();
        if fuse::which("qemu-io").is_some() {
            let out = run_ok(
                Command::new("qemu-io")
                    .args(["-f", "qcow2"])
                    .args(["-c", "write -P 0xab 0 1M"])
                    .args(["-c", "read -P 0xab 0 1M"])
                    .arg(&disk),
                TOOL_TIMEOUT,
            )?;
            let said = format!("{}{}", out.stdout_text(), out.stderr_text());
            ensure!(
                !said.contains("fail") && !said.contains("error"),
                "qemu-io: {said}"
            );
            ensure!(said.contains("wrote 1048576/1048576"), "qemu-io: {said}");
            ensure!(said.contains("read 1048576/1048576"), "qemu-io: {said}");
        } else {
            eprintln!("qemu-io not installed: writing the image with qemu-img convert -n");
            qemu_img(&[
                "convert",
                "-n",
                "-f",
                "raw",
                "-O",
                "qcow2",
                &expected_s,
                &disk_s,
            ])?;
        }
        qemu_img(&["check", &disk_s])?;
        drop_caches();
        qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &expected_s, &disk_s])
            .context("the image through the mount")?;
        let at_origin = origin.path().join("disk.qcow2").display().to_string();
        qemu_img(&["check", &at_origin]).context("the image at the origin")?;
        qemu_img(&[
            "compare",
            "-f",
            "raw",
            "-F",
            "qcow2",
            &expected_s,
            &at_origin,
        ])
        .context("the image at the origin")?;

        // A raw memory image, converted in by path and compared.
        let mem = local.path().join("mem.img");
        gvfs_testbed::data::write_memory_image(&mem, 32 * MIB as u64, 11)?;
        let on_mount = mnt.path().join("mem.raw");
        qemu_img(&[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &mem.display().to_string(),
            &on_mount.display().to_string(),
        ])?;
        drop_caches();
        compare_files(&mem, &on_mount).context("the memory image through the mount")?;
        compare_files(&mem, &origin.path().join("mem.raw"))
            .context("the memory image at the origin")?;
        // Mapped privately, as a VM's RAM from a golden memory file.
        let f = File::open(&on_mount)?;
        let mapped = Mapping::new(&f, 32 * MIB, libc::PROT_READ, libc::MAP_PRIVATE)?.read();
        compare_bytes(&fs::read(&mem)?, &mapped).context("the memory image mapped privately")?;
        Ok(())
    };
    inner().with_context(|| format!("proxy output:\n{}", p.output()))
}
