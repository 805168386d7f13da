use super::*;

#[test]
fn differing_counts_changed_and_extra_bytes() {
    assert_eq!(differing(b"abcd", b"abcd"), 0);
    assert_eq!(differing(b"abcd", b"abXd"), 1);
    assert_eq!(differing(b"ab", b"abcd"), 2);
    assert_eq!(differing(b"abcd", b"ab"), 0);
    assert_eq!(differing(b"", b"xy"), 2);
}

#[test]
fn the_generator_is_deterministic_and_in_range() {
    let (mut a, mut b) = (Rng::new(7), Rng::new(7));
    for _ in 0..100 {
        let x = a.below(10);
        assert_eq!(x, b.below(10));
        assert!(x < 10);
    }
    assert_eq!(a.below(0), 0);
}
