//! PORTMAP version 2 (RFC 1833 section 3): the mapping record and the
//! procedures gvfs answers (NULL, GETPORT, DUMP) and asks (GETPORT).

use crate::xdr::{self, XdrError, XdrReader};

/// PORTMAP program number.
pub const PROGRAM: u32 = 100_000;
/// PORTMAP version 2.
pub const VERSION: u32 = 2;
/// IPPROTO_TCP as PORTMAP spells it.
pub const IPPROTO_TCP: u32 = 6;
/// IPPROTO_UDP as PORTMAP spells it.
pub const IPPROTO_UDP: u32 = 17;

/// PORTMAP v2 procedure numbers.
pub mod procs {
    /// Do nothing.
    pub const NULL: u32 = 0;
    /// Register a mapping.
    pub const SET: u32 = 1;
    /// Remove a mapping.
    pub const UNSET: u32 = 2;
    /// Look up the port of (prog, vers, prot).
    pub const GETPORT: u32 = 3;
    /// List all mappings.
    pub const DUMP: u32 = 4;
}

/// One (program, version, protocol) -> port mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub prot: u32,
    /// Port (ignored in a GETPORT query).
    pub port: u32,
}

impl Mapping {
    /// Decodes a mapping (the argument of SET, UNSET and GETPORT).
    pub fn decode(bytes: &[u8]) -> Result<Self, XdrError> {
        let mut r = XdrReader::new(bytes);
        let m = Self {
            prog: r.u32()?,
            vers: r.u32()?,
            prot: r.u32()?,
            port: r.u32()?,
        };
        if !r.rest().is_empty() {
            return Err(XdrError::Trailing(r.rest().len()));
        }
        Ok(m)
    }

    /// Appends the mapping in XDR.
    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.prog, self.vers, self.prot, self.port] {
            xdr::put_u32(out, v);
        }
    }
}

/// Encodes a DUMP reply: the optional-data list of `mappings`.
pub fn encode_dump(mappings: &[Mapping], out: &mut Vec<u8>) {
    for m in mappings {
        xdr::put_u32(out, 1);
        m.encode(out);
    }
    xdr::put_u32(out, 0);
}

/// Decodes a GETPORT reply: the port, 0 when the program is not registered.
pub fn decode_port(bytes: &[u8]) -> Result<u32, XdrError> {
    XdrReader::new(bytes).u32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_round_trip() {
        let m = Mapping {
            prog: 100_003,
            vers: 3,
            prot: IPPROTO_TCP,
            port: 2049,
        };
        let mut out = Vec::new();
        m.encode(&mut out);
        assert_eq!(Mapping::decode(&out), Ok(m));
        assert!(Mapping::decode(&out[..12]).is_err());
    }
}
