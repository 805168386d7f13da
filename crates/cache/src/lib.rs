//! The gvfs block cache layer: a hashed set-associative write-back disk
//! cache of NFS blocks (DESIGN.md, "block cache").
//!
//! The forwarding foundation needs nothing from it yet; the cache is built
//! by its own issue and stacks between the front end and the upstream as an
//! `gvfs_nfs::NfsService`.
