//! gvfs-proxy: an NFSv3 forwarding and caching proxy.

#![warn(missing_docs)]

pub mod upstream;
