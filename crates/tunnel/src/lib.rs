//! Mutually authenticated TLS tunnels between gvfs proxies (DESIGN.md,
//! "between proxies").
//!
//! The forwarding foundation needs nothing from it yet: the RPC client in
//! `gvfs_nfs::client` already runs over any `Connector`, which is where a
//! TLS connector will plug in.
