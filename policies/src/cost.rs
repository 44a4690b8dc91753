//! Reading a `points` cost from a header, clamped. Costs come from headers
//! that clients or upstreams set: the request's cost header, and the
//! response's `actual_cost_header`, which charges or refunds the difference
//! once the response is known. An unbounded value would let one bogus
//! header drive a bucket years into debt (and, past what Redis's numbers
//! hold exactly, leave its key without a TTL). So every cost is at most the
//! limit's capacity:
//!
//! - a request cost above the capacity could never pass anyway: it counts as
//!   the capacity, so it still passes only a full bucket;
//! - an actual cost above the capacity counts as the capacity: one response
//!   can add at most one full refill to the key's wait.
//!
//! The filter reads both through [`read_cost`]; the shim refuses a larger
//! cost from any caller (`WireLimit::validate`, and the adjust endpoint).

/// The cost in a header value: a whole number in ASCII digits, optionally
/// surrounded by whitespace, at most `capacity` (a larger one, however
/// large, counts as `capacity`). `None` for anything else: empty, signed,
/// fractional, not UTF-8.
pub fn read_cost(value: &[u8], capacity: u32) -> Option<u32> {
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits.iter().try_fold(0u32, |n, d| n.checked_mul(10)?.checked_add(u32::from(d - b'0')));
    Some(n.map_or(capacity, |n| n.min(capacity)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_up_to_the_capacity_are_kept() {
        assert_eq!(read_cost(b"0", 100), Some(0));
        assert_eq!(read_cost(b"7", 100), Some(7));
        assert_eq!(read_cost(b"100", 100), Some(100));
        assert_eq!(read_cost(b"007", 100), Some(7));
        assert_eq!(read_cost(b" \t7\r\n ", 100), Some(7));
    }

    #[test]
    fn anything_larger_counts_as_the_capacity() {
        assert_eq!(read_cost(b"101", 100), Some(100));
        assert_eq!(read_cost(b"4294967295", 100), Some(100));
        assert_eq!(read_cost(b"4294967296", 100), Some(100));
        assert_eq!(read_cost(b"99999999999999999999999999999999999999", 100), Some(100));
        assert_eq!(read_cost(&[b'9'; 10_000], 1_000_000_000), Some(1_000_000_000));
    }

    #[test]
    fn anything_else_is_no_cost() {
        for bad in
            [&b""[..], b"  ", b"-1", b"-0", b"+5", b"1.5", b"1e3", b"0x10", b"5 5", b"five", b"\xff\xfe"]
        {
            assert_eq!(read_cost(bad, 100), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
