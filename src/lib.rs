//! Test fixtures for gvfs (real peers: nfs-ganesha, libnfs, QEMU).
