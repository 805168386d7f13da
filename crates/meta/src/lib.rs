//! The gvfs metadata-action layer: zero-block maps and compress-and-copy of
//! whole files driven by `.NAME.gvfsmeta` files (DESIGN.md, "meta layer").
//!
//! The forwarding foundation needs nothing from it yet; it is built by its
//! own issue and stacks above the block cache as an `gvfs_nfs::NfsService`.
