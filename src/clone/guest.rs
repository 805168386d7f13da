//! The guest side of the clone benchmark: a kernel and initramfs (the
//! "kit"), golden images made by booting and suspending a guest, and the
//! resume of a clone, all with an unmodified QEMU under TCG.
//!
//! # The kit
//! Debian's kernel ([`crate::debian_kernel`]: `linux-image-amd64`, fetched
//! with `apt-get download`, no root needed) and an initramfs written here
//! as a `newc` archive: the static busybox, the eleven modules the guest needs
//! for a virtio disk with ext4, and [`INIT`]. Built once under
//! `target/gvfs-guest/` and reused while [`KIT_STAMP`] is unchanged.
//!
//! # A golden image (one directory)
//! - `disk.qcow2`: an ext4 file system (`mke2fs -d`, 4 KiB blocks, no root
//!   needed) with the files of [`files`]: system files the same on every
//!   image (`sys/`, read at boot, and `usr/`), the image's own working set
//!   (`boot/`, read at boot), `run/` (small files the running guest reads,
//!   one per tick) and `data/` (the rest of its own files, never read);
//! - `mem`: guest RAM as a raw file (`memory-backend-file`), mostly zeros;
//!   its pages of the kernel and of the system files are in the other
//!   images' too ([`super::census`] counts them);
//! - `state`: the device state, saved with `x-ignore-shared` so it leaves
//!   RAM out (a few hundred KB);
//! - `vm.json` ([`VmConfig`]): what a clone needs to start the same machine
//!   and check that it runs on.
//!
//! The guest prints `tick N MD5` about ten times a second, where MD5 is the
//! digest of `run/(N mod R)` read from its disk. A clone is verified running
//! when its serial line continues the golden counter with the right digest:
//! the memory, the device state and the disk all came through intact.
//!
//! # Requests (time to responsiveness)
//! The guest also answers requests on its second serial port (`ttyS1`, a
//! unix socket `req.sock` on the host): a line `ID` gets `answer ID MD5` on
//! the console, MD5 being the digest of the `boot/` files read again from
//! the guest's page cache, so from the memory image ([`VmConfig::boot_sum`]).
//! A clone answers once it is verified running ([`resume_clone`]): the
//! answer is real work on a sizable part of the guest's memory, which a
//! lazy clone has to bring in first.
//!
//! # Two ways to map a clone's memory ([`RamMapping`])
//! A copy-first clone maps its own copy of `mem` shared (`share=on`); a
//! lazy clone maps the golden `mem` itself privately and read-only
//! (`share=off,readonly=on,rom=off`): pages are read when the guest first
//! touches them, its writes stay in QEMU's private copy and the golden file
//! is never written.
//!
//! # Where each part is
//! `kit` makes the kit, [`files`] the files of an image's disk, `golden` a
//! golden image, `resume` a clone's resume, and `qemu` runs QEMU and talks
//! to it over QMP; `limits` holds the timeouts they share.

mod golden;
mod kit;
mod limits;
mod qemu;
mod resume;

pub mod files;

pub use crate::debian_kernel::kit_dir;
pub use files::GoldenSize;
pub use golden::{Booted, CONFIG, DISK, FILES, MEM, STATE, VmConfig, build_golden, create_overlay};
pub use kit::{GuestKit, INIT, KIT_STAMP};
pub use qemu::{Qmp, RamMapping, serial_ticks};
pub use resume::{Live, Resumed, Watch, resume_clone, resume_live};
