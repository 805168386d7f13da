//! Small XDR helpers (RFC 4506) on top of `nfs3_types`' codec.

use std::io::Cursor;

use nfs3_types::xdr_codec::{Pack, Unpack};

/// Why bytes could not be decoded as the XDR value expected.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum XdrError {
    /// The input ended before the value did.
    #[error("truncated XDR")]
    Truncated,
    /// A field held a value outside its type (bad enum, bad bool).
    #[error("invalid XDR value {0}")]
    InvalidValue(u32),
    /// A variable-length field was longer than its cap.
    #[error("XDR field of {len} bytes exceeds limit {limit}")]
    TooLong {
        /// Length announced.
        len: usize,
        /// Cap in force.
        limit: usize,
    },
    /// Bytes were left over after the value.
    #[error("{0} trailing bytes after XDR value")]
    Trailing(usize),
}

impl From<nfs3_types::xdr_codec::Error> for XdrError {
    fn from(e: nfs3_types::xdr_codec::Error) -> Self {
        use nfs3_types::xdr_codec::Error as E;
        match e {
            E::Io(_) => Self::Truncated,
            E::InvalidEnumValue(v) => Self::InvalidValue(v),
            E::InvalidLength(len) | E::ObjectTooLarge(len) => Self::TooLong { len, limit: 0 },
        }
    }
}

/// Decodes exactly one `T` from `bytes`; trailing bytes are an error.
///
/// Safe on hostile input: `nfs3_types` is patched (vendor/nfs3_types) so that
/// no peer-supplied length reserves memory beyond what `bytes` holds.
pub fn decode_exact<T: Unpack>(bytes: &[u8]) -> Result<T, XdrError> {
    let mut cur = Cursor::new(bytes);
    let (value, _) = T::unpack(&mut cur)?;
    let used = usize::try_from(cur.position()).unwrap_or(usize::MAX);
    if used != bytes.len() {
        return Err(XdrError::Trailing(bytes.len().saturating_sub(used)));
    }
    Ok(value)
}

/// Appends the XDR encoding of `value` to `out`.
pub fn encode_into<T: Pack>(out: &mut Vec<u8>, value: &T) {
    out.reserve(value.packed_size());
    // Writing to a Vec cannot fail; a value too large to encode (over 4 GiB)
    // cannot be built from bounded input.
    let _ = value.pack(out);
}

/// A forward-only reader of XDR primitives over a byte slice.
#[derive(Debug)]
pub struct XdrReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> XdrReader<'a> {
    /// Starts reading at the beginning of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The bytes not yet consumed.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    /// Reads a big-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, XdrError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Reads a big-endian `u64` (XDR's unsigned hyper, RFC 4506 section 4.5).
    pub fn u64(&mut self) -> Result<u64, XdrError> {
        let hi = u64::from(self.u32()?);
        Ok(hi << 32 | u64::from(self.u32()?))
    }

    /// `Ok` when every byte was read, else [`XdrError::Trailing`]: what a
    /// decoder of a whole message says at its end.
    pub fn end(&self) -> Result<(), XdrError> {
        match self.rest().len() {
            0 => Ok(()),
            n => Err(XdrError::Trailing(n)),
        }
    }

    /// Reads variable-length opaque data of at most `limit` bytes, skipping
    /// its padding, without copying.
    pub fn opaque(&mut self, limit: usize) -> Result<&'a [u8], XdrError> {
        let len = self.u32()? as usize;
        if len > limit {
            return Err(XdrError::TooLong { len, limit });
        }
        let data = self.take(len)?;
        self.take((4 - len % 4) % 4)?;
        Ok(data)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        let end = self.pos.checked_add(n).ok_or(XdrError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(XdrError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
}

/// Appends a big-endian `u32`.
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// Appends a big-endian `u64` (XDR's unsigned hyper).
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// Appends variable-length opaque data with its padding.
pub fn put_opaque(out: &mut Vec<u8>, data: &[u8]) {
    put_u32(out, u32::try_from(data.len()).unwrap_or(u32::MAX));
    out.extend_from_slice(data);
    out.extend_from_slice(&[0u8; 3][..(4 - data.len() % 4) % 4]);
}

/// The longest run of zeros [`zeros`] lends without allocating.
pub const ZEROS_LEN: usize = 1 << 20;

/// One static run of zeros, in memory no page of which is ever written.
static ZEROS: [u8; ZEROS_LEN] = [0; ZEROS_LEN];

/// `len` zero bytes for a reply's data: borrowed from one static run up to
/// [`ZEROS_LEN`] (nothing allocated, nothing zeroed; the socket copies from
/// pages that stay in the cache), allocated beyond it.
pub fn zeros(len: usize) -> std::borrow::Cow<'static, [u8]> {
    match ZEROS.get(..len) {
        Some(run) => std::borrow::Cow::Borrowed(run),
        None => std::borrow::Cow::Owned(vec![0; len]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_lent_up_to_a_mebibyte_and_made_beyond() {
        for len in [0, 1, 4096, ZEROS_LEN] {
            let z = zeros(len);
            assert!(matches!(z, std::borrow::Cow::Borrowed(_)));
            assert_eq!(z.len(), len);
        }
        let big = zeros(ZEROS_LEN + 3);
        assert!(matches!(big, std::borrow::Cow::Owned(_)));
        assert_eq!(big.len(), ZEROS_LEN + 3);
        assert!(big.iter().all(|&b| b == 0));
    }
}
