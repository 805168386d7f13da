//! The kit: Debian's kernel ([`crate::debian_kernel`]: `linux-image-amd64`,
//! fetched with `apt-get download`, no root needed) and an initramfs
//! written here as a `newc` archive: the static busybox, the modules the
//! guest needs for a virtio disk with ext4 ([`MODULES`]), and [`INIT`].
//! Built once under `target/gvfs-guest/` and reused while [`KIT_STAMP`] is
//! unchanged.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::debian_kernel::{KernelPackage, Newc, busybox};

/// Changes whenever the kit's content would change (init script, modules).
pub const KIT_STAMP: &str = "gvfs-guest-kit 5";

/// Modules the guest loads, in dependency order (read from each module's
/// `depends=`; Debian's package ships no modules.dep).
const MODULES: [&str; 11] = [
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "virtio_blk",
    "crc16",
    "mbcache",
    "jbd2",
    "crc32c_generic",
    "ext4",
];

/// The guest's /init.
pub const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in MODULES; do insmod /lib/modules/$m.ko || echo "gvfs-guest: insmod $m failed"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 200 ]; do usleep 50000; i=$((i+1)); done
mkdir -p /mnt
mount -t ext4 -o ro /dev/vda /mnt || echo "gvfs-guest: mount failed"
# The system files every image shares, then this image's own working set:
# both stay in the page cache, so in the memory image.
for f in /mnt/sys/* /mnt/boot/*; do [ -f "$f" ] && cat "$f"; done > /dev/null
# Requests on the second serial port: each line is an id, answered on the
# console with the MD5 of the boot/ files (from the page cache by now).
(
  stty -echo 2>/dev/null
  while read -r id; do
    set -- $(cat /mnt/boot/* | md5sum)
    echo "answer $id $1"
  done
  echo "gvfs-guest: the request port closed"
) < /dev/ttyS1 &
# A busy guest (gvfs.busy=N on the kernel command line) never goes quiet:
# N MiB of random data in a tmpfs, and every 0.1 s a fork, a read of 1 MiB
# of the data at random and a 256 KiB string made.
busy=$(sed -n 's/.*gvfs\.busy=\([0-9][0-9]*\).*/\1/p' /proc/cmdline)
if [ -n "$busy" ] && [ "$busy" -gt 0 ]; then
  mkdir -p /tmp
  mount -t tmpfs -o size=$((busy + 16))m tmpfs /tmp || echo "gvfs-guest: tmpfs failed"
  dd if=/dev/urandom of=/tmp/data bs=1048576 count=$busy 2>/dev/null
  (
    while :; do
      ( : ) &
      dd if=/tmp/data of=/dev/null bs=1048576 count=1 skip=$((RANDOM % busy)) 2>/dev/null
      s=$(dd if=/dev/zero bs=262144 count=1 2>/dev/null | tr '\0' b)
      wait
      usleep 100000
    done
  ) &
fi
runs=$(ls /mnt/run | wc -l)
echo "gvfs-guest ready runs=$runs"
n=0
while :; do
  n=$((n+1))
  set -- $(md5sum /mnt/run/$((n % runs)))
  echo "tick $n $1"
  usleep 100000
done
"#;

/// A kernel and initramfs for the guest.
#[derive(Debug, Clone)]
pub struct GuestKit {
    /// The kernel (`-kernel`).
    pub kernel: PathBuf,
    /// The initramfs (`-initrd`), an uncompressed newc archive.
    pub initrd: PathBuf,
}

impl GuestKit {
    /// The kit in `dir`, built there first if it is missing or stale.
    pub fn prepare(dir: &Path) -> Result<Self> {
        let kit = Self {
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.cpio"),
        };
        let stamp = dir.join("stamp");
        if std::fs::read_to_string(&stamp).ok().as_deref() == Some(KIT_STAMP)
            && kit.kernel.is_file()
            && kit.initrd.is_file()
        {
            return Ok(kit);
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let package = KernelPackage::fetch(dir)?;
        std::fs::copy(&package.vmlinuz, &kit.kernel)
            .with_context(|| format!("copying {}", package.vmlinuz.display()))?;
        write_initramfs(&kit.initrd, &package)?;
        std::fs::write(&stamp, KIT_STAMP)?;
        Ok(kit)
    }
}

/// Writes the initramfs: busybox, the modules, /init and /dev/console.
fn write_initramfs(path: &Path, package: &KernelPackage) -> Result<()> {
    let mut cpio = Newc::default();
    for dir in ["bin", "dev", "proc", "sys", "mnt", "lib", "lib/modules"] {
        cpio.dir(dir);
    }
    cpio.char_device("dev/console", 5, 1);
    cpio.file("bin/busybox", 0o755, std::fs::read(busybox()?)?);
    let init = INIT.replace("MODULES", &MODULES.join(" "));
    cpio.file("init", 0o755, init.into_bytes());
    for m in MODULES {
        cpio.file(
            &format!("lib/modules/{m}.ko"),
            0o644,
            std::fs::read(package.module(m)?)?,
        );
    }
    std::fs::write(path, cpio.finish()).with_context(|| format!("writing {}", path.display()))
}
