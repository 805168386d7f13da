//! Mapping an authenticated peer to the credentials the upstream sees, like
//! GVFS's logical user accounts: an image server trusts a peer's TLS
//! certificate, not the uid a remote client claims in AUTH_UNIX.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use gvfs_nfs::rpc::{AuthUnix, Credentials};

use crate::error::MappingError;

/// What to do with the credentials of calls from one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapping {
    /// Every call runs as this uid/gid (no supplementary groups).
    Fixed {
        /// The uid.
        uid: u32,
        /// The gid.
        gid: u32,
    },
    /// The caller's AUTH_UNIX uid and gid pass through if both lie in
    /// `first..=last`; otherwise the call is squashed. Supplementary groups
    /// outside the range are dropped.
    Range {
        /// The lowest id let through.
        first: u32,
        /// The highest id let through.
        last: u32,
    },
    /// The caller's credentials pass through unchanged.
    PassThrough,
    /// Squashed to the map's nobody uid/gid.
    Squash,
}

impl fmt::Display for Mapping {
    /// The form [`FromStr`] parses.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mapping::Fixed { uid, gid } => write!(f, "fixed:{uid}:{gid}"),
            Mapping::Range { first, last } => write!(f, "range:{first}-{last}"),
            Mapping::PassThrough => f.write_str("pass"),
            Mapping::Squash => f.write_str("squash"),
        }
    }
}

impl FromStr for Mapping {
    type Err = MappingError;

    /// Parses `fixed:UID:GID`, `range:FIRST-LAST`, `pass` or `squash`.
    fn from_str(s: &str) -> Result<Self, MappingError> {
        let id = |what: &'static str, v: &str| {
            v.parse::<u32>().map_err(|_| MappingError::BadId {
                text: s.to_owned(),
                what,
                value: v.to_owned(),
            })
        };
        let malformed = |expected| MappingError::Malformed {
            text: s.to_owned(),
            expected,
        };
        let (kind, rest) = match s.split_once(':') {
            Some((kind, rest)) => (kind, Some(rest)),
            None => (s, None),
        };
        match (kind, rest) {
            ("pass", None) => Ok(Mapping::PassThrough),
            ("squash", None) => Ok(Mapping::Squash),
            ("fixed", Some(rest)) => {
                let (uid, gid) = rest
                    .split_once(':')
                    .ok_or_else(|| malformed("fixed:UID:GID"))?;
                Ok(Mapping::Fixed {
                    uid: id("uid", uid)?,
                    gid: id("gid", gid)?,
                })
            }
            ("range", Some(rest)) => {
                let (first, last) = rest
                    .split_once('-')
                    .ok_or_else(|| malformed("range:FIRST-LAST"))?;
                let (first, last) = (id("first id", first)?, id("last id", last)?);
                if first > last {
                    return Err(MappingError::EmptyRange {
                        text: s.to_owned(),
                        first,
                        last,
                    });
                }
                Ok(Mapping::Range { first, last })
            }
            _ => Err(MappingError::UnknownKind { text: s.to_owned() }),
        }
    }
}

/// Which peers get which [`Mapping`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityMap {
    /// Rules by peer name (the name [`crate::peer_name`] gives).
    pub peers: BTreeMap<String, Mapping>,
    /// The rule for peers not in `peers`, and for clients with no certificate.
    pub unknown: Mapping,
    /// The uid and gid of a squashed call.
    pub nobody: (u32, u32),
}

impl Default for IdentityMap {
    /// No peer rules, unknown peers squashed, nobody = 65534:65534.
    fn default() -> Self {
        IdentityMap {
            peers: BTreeMap::new(),
            unknown: Mapping::Squash,
            nobody: (65534, 65534),
        }
    }
}

impl IdentityMap {
    /// The rule that applies to `peer` (`None`: a client with no certificate).
    pub fn mapping_for(&self, peer: Option<&str>) -> &Mapping {
        peer.and_then(|p| self.peers.get(p))
            .unwrap_or(&self.unknown)
    }

    /// The credentials the upstream should see for a call from `peer`
    /// (`None`: a client with no certificate) carrying `cred`.
    ///
    /// An AUTH_NONE call gets the fixed uid/gid under [`Mapping::Fixed`] and
    /// nobody under every other rule, always as AUTH_UNIX. A squashed
    /// AUTH_UNIX call keeps its machine name and stamp.
    pub fn map(&self, peer: Option<&str>, cred: &Credentials) -> Credentials {
        let (nobody_uid, nobody_gid) = self.nobody;
        let mapping = self.mapping_for(peer);
        let unix = match cred {
            Credentials::Unix(unix) => unix,
            Credentials::None => {
                return match *mapping {
                    Mapping::Fixed { uid, gid } => Credentials::unix(uid, gid),
                    _ => Credentials::unix(nobody_uid, nobody_gid),
                };
            }
        };
        let with_ids = |uid, gid, gids| {
            Credentials::Unix(AuthUnix {
                stamp: unix.stamp,
                machine: unix.machine.clone(),
                uid,
                gid,
                gids,
            })
        };
        match *mapping {
            Mapping::PassThrough => cred.clone(),
            Mapping::Fixed { uid, gid } => with_ids(uid, gid, Vec::new()),
            Mapping::Range { first, last } => {
                let inside = |id: &u32| (first..=last).contains(id);
                if inside(&unix.uid) && inside(&unix.gid) {
                    let gids = unix.gids.iter().copied().filter(inside).collect();
                    with_ids(unix.uid, unix.gid, gids)
                } else {
                    with_ids(nobody_uid, nobody_gid, Vec::new())
                }
            }
            Mapping::Squash => with_ids(nobody_uid, nobody_gid, Vec::new()),
        }
    }

    /// Parses `NAME=MAPPING`, the command-line form of one peer rule.
    pub fn parse_rule(s: &str) -> Result<(String, Mapping), MappingError> {
        let (name, mapping) = s
            .split_once('=')
            .ok_or_else(|| MappingError::NotARule { text: s.to_owned() })?;
        let name = name.trim();
        if name.is_empty() {
            return Err(MappingError::EmptyName { text: s.to_owned() });
        }
        Ok((name.to_owned(), mapping.trim().parse()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32, gid: u32, gids: &[u32]) -> Credentials {
        Credentials::Unix(AuthUnix {
            stamp: 7,
            machine: b"client-host".to_vec(),
            uid,
            gid,
            gids: gids.to_vec(),
        })
    }

    fn map_with(rules: &[(&str, Mapping)]) -> IdentityMap {
        IdentityMap {
            peers: rules
                .iter()
                .map(|(n, m)| (n.to_string(), m.clone()))
                .collect(),
            ..IdentityMap::default()
        }
    }

    #[test]
    fn fixed_replaces_the_ids_and_drops_groups() {
        let map = map_with(&[(
            "lan",
            Mapping::Fixed {
                uid: 1000,
                gid: 100,
            },
        )]);
        assert_eq!(
            map.map(Some("lan"), &caller(0, 0, &[0, 10])),
            caller(1000, 100, &[])
        );
    }

    #[test]
    fn range_passes_inside_and_squashes_outside() {
        let map = map_with(&[(
            "lan",
            Mapping::Range {
                first: 1000,
                last: 1999,
            },
        )]);
        assert_eq!(
            map.map(Some("lan"), &caller(1500, 1000, &[1001, 0, 5000])),
            caller(1500, 1000, &[1001])
        );
        assert_eq!(
            map.map(Some("lan"), &caller(0, 1000, &[])),
            caller(65534, 65534, &[])
        );
        assert_eq!(
            map.map(Some("lan"), &caller(1000, 0, &[])),
            caller(65534, 65534, &[])
        );
        assert_eq!(
            map.map(Some("lan"), &caller(1999, 1999, &[])),
            caller(1999, 1999, &[])
        );
    }

    #[test]
    fn pass_through_keeps_everything() {
        let map = map_with(&[("lan", Mapping::PassThrough)]);
        let c = caller(0, 0, &[1, 2, 3]);
        assert_eq!(map.map(Some("lan"), &c), c);
    }

    #[test]
    fn squash_keeps_the_machine_name() {
        let mut map = map_with(&[("lan", Mapping::Squash)]);
        map.nobody = (99, 98);
        assert_eq!(
            map.map(Some("lan"), &caller(0, 0, &[4])),
            caller(99, 98, &[])
        );
    }

    #[test]
    fn unknown_and_certificateless_peers_get_the_unknown_rule() {
        let map = map_with(&[("lan", Mapping::PassThrough)]);
        assert_eq!(
            map.map(Some("stranger"), &caller(0, 0, &[])),
            caller(65534, 65534, &[])
        );
        assert_eq!(map.map(None, &caller(0, 0, &[])), caller(65534, 65534, &[]));
        let open = IdentityMap {
            unknown: Mapping::PassThrough,
            ..map
        };
        assert_eq!(open.map(None, &caller(5, 6, &[])), caller(5, 6, &[]));
        // Names match exactly.
        assert_eq!(open.map(Some("LAN"), &caller(5, 6, &[])), caller(5, 6, &[]));
    }

    #[test]
    fn auth_none_callers() {
        let map = map_with(&[
            ("fixed", Mapping::Fixed { uid: 10, gid: 20 }),
            ("pass", Mapping::PassThrough),
            (
                "range",
                Mapping::Range {
                    first: 0,
                    last: 100,
                },
            ),
            ("squash", Mapping::Squash),
        ]);
        assert_eq!(
            map.map(Some("fixed"), &Credentials::None),
            Credentials::unix(10, 20)
        );
        for peer in [Some("pass"), Some("range"), Some("squash"), Some("x"), None] {
            assert_eq!(
                map.map(peer, &Credentials::None),
                Credentials::unix(65534, 65534),
                "{peer:?}"
            );
        }
    }

    #[test]
    fn parse_mappings() {
        assert_eq!("pass".parse(), Ok(Mapping::PassThrough));
        assert_eq!("squash".parse(), Ok(Mapping::Squash));
        assert_eq!(
            "fixed:1000:100".parse(),
            Ok(Mapping::Fixed {
                uid: 1000,
                gid: 100
            })
        );
        assert_eq!(
            "range:1000-1999".parse(),
            Ok(Mapping::Range {
                first: 1000,
                last: 1999
            })
        );
        for m in [
            Mapping::PassThrough,
            Mapping::Squash,
            Mapping::Fixed { uid: 1, gid: 2 },
            Mapping::Range { first: 3, last: 3 },
        ] {
            assert_eq!(m.to_string().parse(), Ok(m));
        }
    }

    #[test]
    fn parse_errors_say_what_is_wrong() {
        let err = |s: &str| s.parse::<Mapping>().unwrap_err().to_string();
        assert!(err("root").contains("unknown mapping"), "{}", err("root"));
        assert!(err("fixed:1000").contains("fixed:UID:GID"));
        assert!(err("fixed:a:1").contains("uid \"a\""));
        assert!(err("fixed:1:-1").contains("gid"));
        assert!(err("range:10").contains("range:FIRST-LAST"));
        assert!(err("range:10-5").contains("empty"));
        assert!(err("range:1-99999999999").contains("last id"));
        assert!(err("pass:1").contains("unknown mapping"));
        assert!(err("").contains("unknown mapping"));
    }

    #[test]
    fn parse_rules() {
        assert_eq!(
            IdentityMap::parse_rule("lan-proxy=fixed:1:2"),
            Ok(("lan-proxy".to_owned(), Mapping::Fixed { uid: 1, gid: 2 }))
        );
        assert_eq!(
            IdentityMap::parse_rule(" a = pass "),
            Ok(("a".to_owned(), Mapping::PassThrough))
        );
        let err = |s: &str| IdentityMap::parse_rule(s).unwrap_err();
        assert!(err("lan").to_string().contains("NAME=MAPPING"));
        assert_eq!(
            err("=pass"),
            MappingError::EmptyName {
                text: "=pass".into()
            }
        );
        assert_eq!(
            err("a=bogus"),
            MappingError::UnknownKind {
                text: "bogus".into()
            }
        );
        assert!(err("a=bogus").to_string().contains("unknown mapping"));
    }
}
