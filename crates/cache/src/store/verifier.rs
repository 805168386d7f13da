//! New write verifiers (RFC 1813 section 3.3.7): a cache changes its
//! verifier when dirty data may have been lost, on open or while running.

use std::hash::{BuildHasher, Hasher};

/// A write verifier that is neither zero nor one of `old`.
pub(super) fn new_verifier(old: &[[u8; 8]]) -> [u8; 8] {
    let state = std::collections::hash_map::RandomState::new();
    let mut salt = 0u64;
    loop {
        let mut h = state.build_hasher();
        h.write_u64(salt);
        if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(d.as_nanos());
        }
        h.write_u32(std::process::id());
        let v = h.finish().to_le_bytes();
        if v != [0; 8] && !old.contains(&v) {
            return v;
        }
        salt += 1;
    }
}
