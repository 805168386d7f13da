//! gvfs' test bed (`gvfs-testbed`): real peers (nfs-ganesha, libnfs, QEMU) and the
//! proxy binary, run on loopback from integration tests.
//!
//! - [`portmap`]: a loopback-only portmapper (PORTMAP v2, rpcbind v3/v4) in
//!   background threads, which ganesha needs to start.
//! - [`ganesha`]: nfs-ganesha serving a temporary directory over NFSv3.
//! - [`libnfs`]: `nfs-cp`, `nfs-cat`, `nfs-ls` and `qemu-img` wrappers and
//!   the libnfs URL builder.
//! - [`nfsclient`]: an async NFSv3 client (gvfs_nfs' RPC client) for calls
//!   libnfs cannot make.
//! - [`proxy`]: the `gvfs-proxy` binary as a child process.
//! - [`stats`]: its counters (`gvfsctl stats --json`), typed.
//! - [`site`]: a whole site built from what a test names (origin, image
//!   server, WAN link, LAN proxy, nodes, PKI), torn down on drop.
//! - [`data`]: deterministic file contents, sparse files, comparisons.
//! - [`process`]: child processes with deadlines.
//! - [`debian_kernel`]: Debian's kernel package and an initramfs writer for
//!   QEMU guests.
//! - [`clone`]: the VM clone benchmark (QEMU guests, golden images, scenarios).
//! - [`kernel`]: the Linux kernel NFS client in a QEMU guest, as a test peer.
//! - [`soak`]: the soak benchmark (many clients through a caching chain over
//!   TLS for a long time, every byte checked).
//! - [`rpc_client`]: a synchronous RPC client and raw MOUNT/READDIR probes.
//! - [`tmpfs`]: a small tmpfs that fills up, for full-disk tests.
//! - [`fuse`]: the FUSE front end: mount points that clean up after
//!   themselves, a proxy with its mount, calls as another user.
//! - [`tree`]: an expected directory tree, checked against a real one.
//! - [`systemd`]: a fake service manager's notification socket (readiness,
//!   the file descriptor store).
//!
//! The fixtures are synchronous (all but [`nfsclient`]): tests call them
//! from plain `#[test]` functions.
//! Every child process is stopped on drop and every wait has a timeout.

#![warn(missing_docs)]

pub mod bench;
pub mod clone;
pub mod data;
pub mod debian_kernel;
pub mod fuse;
pub mod ganesha;
pub mod kernel;
pub mod libnfs;
pub mod nfsclient;
pub mod portmap;
pub mod process;
pub mod proxy;
pub mod rpc_client;
pub mod site;
pub mod soak;
pub mod stats;
pub mod systemd;
pub mod tmpfs;
pub mod tree;

pub use ganesha::{Ganesha, Squash};
pub use gvfs_proxy::status::Status;
pub use portmap::Portmapper;
pub use proxy::{Proxy, ProxyArgs, WritePolicy};
pub use site::{Origin, Site, SiteProxy, Tier};
pub use stats::Stats;
