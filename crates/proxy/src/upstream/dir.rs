//! dir
