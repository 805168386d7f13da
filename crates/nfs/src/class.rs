//! Who a request is for and how much it matters: the priority class a
//! fetch carries across the cascade, and the tenant it is billed to at a
//! shared proxy.
//!
//! Classes are ordered: a reader waiting ([`Class::Demand`]) goes before a
//! working-set profile, which goes before the background stream, which goes
//! before bulk (a whole-file copy, a sequential reader of another image).
//! On the wire a class is a `uint32` from 0 (bulk) to 3 (demand).

/// How much a fetch matters; higher goes first.
#[repr(u8)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Class {
    /// A whole-file copy or a sequential reader of a whole image: fills
    /// what the others leave.
    Bulk = 0,
    /// Ahead of any reader, in file order.
    Background = 1,
    /// Named by the file's working-set profile: fetched first, ahead of
    /// the readers that will want it.
    Profile = 2,
    /// A reader waits for it now.
    Demand = 3,
}

impl Class {
    /// Every class, lowest first.
    pub const ALL: [Class; 4] = [
        Class::Bulk,
        Class::Background,
        Class::Profile,
        Class::Demand,
    ];

    /// The class's number on the wire.
    pub fn wire(self) -> u32 {
        self as u32
    }

    /// The class a wire number names, if any.
    pub fn from_wire(n: u32) -> Option<Class> {
        Class::ALL.get(usize::try_from(n).ok()?).copied()
    }

    /// The class's name as status and logs show it.
    pub fn name(self) -> &'static str {
        match self {
            Class::Bulk => "bulk",
            Class::Background => "background",
            Class::Profile => "profile",
            Class::Demand => "demand",
        }
    }
}

/// Whom a request is billed to at a shared proxy: one per peer identity
/// (a TLS certificate's name) or, without one, per connection.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord)]
pub struct Tenant(pub u64);

impl Tenant {
    /// The proxy itself: its own background work and its local callers.
    pub const LOCAL: Tenant = Tenant(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_numbers_round_trip_and_order_is_priority() {
        for c in Class::ALL {
            assert_eq!(Class::from_wire(c.wire()), Some(c));
        }
        assert_eq!(Class::from_wire(4), None);
        assert_eq!(Class::from_wire(u32::MAX), None);
        assert!(Class::Demand > Class::Profile);
        assert!(Class::Profile > Class::Background);
        assert!(Class::Background > Class::Bulk);
    }
}
