//! Unsigned LEB128 varints: 7 bits per byte, low group first, the top bit set on every byte but
//! the last.
//!
//! Where small numbers dominate a field, a varint is shorter than a fixed-width integer: values
//! below 128 take one byte, below 16,384 two. A `u32` takes at most [`MAX_LEN_U32`] bytes, a
//! `u64` at most [`MAX_LEN_U64`]. meshwire uses them for a batch's chunk prefix
//! ([`crate::batch`]), the session's ACK fields and a datagram's protocol tag. (QUIC's own
//! varints, two length bits in the first byte, are a different encoding and are not read here.)
//!
//! Decoding is for bytes a hostile peer sent: it never panics, never reads more bytes than its type
//! takes, and tells a varint that has not fully arrived ([`VarintError::Truncated`], wait for more
//! bytes) from one that can never be valid ([`VarintError::Overlong`], [`VarintError::Overflow`]).
//! Two readings:
//!
//! - [`get_u64`] and [`get_u32`] accept any encoding within the type's length whose value fits,
//!   including padded ones (`[0x80, 0x00]` is 0);
//! - [`get_canonical_u32`] accepts only the shortest encoding of each value ([`put`]'s), so
//!   decoding and re-encoding give back the same bytes.

use bytes::BufMut;

/// Most bytes of a `u64` varint (64 bits in 7-bit groups).
pub const MAX_LEN_U64: usize = 10;
/// Most bytes of a `u32` varint (32 bits in 7-bit groups).
pub const MAX_LEN_U32: usize = 5;

/// Why bytes are not a varint of the type asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VarintError {
    /// The bytes end before the varint's last byte: more may make it whole.
    #[error("truncated varint")]
    Truncated,
    /// More bytes than the type takes, or (canonical reading) more than the value needs.
    #[error("overlong varint")]
    Overlong,
    /// The value does not fit the type.
    #[error("varint value out of range")]
    Overflow,
}

/// Bytes [`put`] writes for `value`: 1 to [`MAX_LEN_U64`].
pub fn encoded_len(value: u64) -> usize {
    let bits = 64 - (value | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Appends `value` in its shortest encoding.
pub fn put(out: &mut impl BufMut, mut value: u64) {
    while value >= 0x80 {
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// Reads a `u64` varint from the front of `input` and advances past it; on an error `input` is
/// left as it was.
pub fn get_u64(input: &mut &[u8]) -> Result<u64, VarintError> {
    get(input, u64::MAX, false)
}

/// Reads a `u32` varint from the front of `input` and advances past it; on an error `input` is
/// left as it was.
pub fn get_u32(input: &mut &[u8]) -> Result<u32, VarintError> {
    get(input, u32::MAX.into(), false).map(|value| value as u32)
}

/// Reads a `u32` varint in its shortest encoding from the front of `input` and advances past it; a
/// padded encoding is [`VarintError::Overlong`]. On an error `input` is left as it was.
pub fn get_canonical_u32(input: &mut &[u8]) -> Result<u32, VarintError> {
    get(input, u32::MAX.into(), true).map(|value| value as u32)
}

/// Reads a varint of at most `max` (`u32::MAX` or `u64::MAX`: all ones, so the last byte's
/// bound below is exact).
fn get(input: &mut &[u8], max: u64, canonical: bool) -> Result<u64, VarintError> {
    let max_len = encoded_len(max);
    let mut value = 0u64;
    for index in 0..max_len {
        let Some(&byte) = input.get(index) else {
            return Err(VarintError::Truncated);
        };
        if byte & 0x80 != 0 && index + 1 == max_len {
            return Err(VarintError::Overlong);
        }
        let shift = 7 * index as u32;
        let group = u64::from(byte & 0x7f);
        if group > max >> shift {
            return Err(VarintError::Overflow);
        }
        value |= group << shift;
        if byte & 0x80 == 0 {
            if canonical && index > 0 && byte == 0 {
                return Err(VarintError::Overlong);
            }
            *input = &input[index + 1..];
            return Ok(value);
        }
    }
    // Not reached: the last byte a type takes either ends the varint or was refused above.
    Err(VarintError::Overlong)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(value: u64) -> Vec<u8> {
        let mut out = Vec::new();
        put(&mut out, value);
        out
    }

    #[test]
    fn known_encodings() {
        assert_eq!(encode(0), [0]);
        assert_eq!(encode(1), [1]);
        assert_eq!(encode(127), [0x7f]);
        assert_eq!(encode(128), [0x80, 1]);
        assert_eq!(encode(300), [0xac, 0x02]);
        assert_eq!(encode(500), [0xf4, 0x03]);
        assert_eq!(encode(u32::MAX.into()), [0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(encode(u64::MAX).len(), MAX_LEN_U64);
        assert_eq!(encoded_len(u32::MAX.into()), MAX_LEN_U32);
        assert_eq!(encoded_len(u64::MAX), MAX_LEN_U64);
    }

    #[test]
    fn malformed_encodings_are_typed_errors() {
        let get32 = |bytes: &[u8]| get_u32(&mut &bytes[..]);
        let get64 = |bytes: &[u8]| get_u64(&mut &bytes[..]);
        assert_eq!(get32(&[]), Err(VarintError::Truncated));
        assert_eq!(get32(&[0x80, 0x80]), Err(VarintError::Truncated));
        // Five bytes, the fifth still continued: a u32 never takes six.
        assert_eq!(get32(&[0x80; 5]), Err(VarintError::Overlong));
        assert_eq!(
            get32(&[0x80, 0x80, 0x80, 0x80, 0x80, 0]),
            Err(VarintError::Overlong)
        );
        // u32::MAX + 1, and a fifth byte with bits above the 32nd.
        assert_eq!(get32(&encode(1 << 32)), Err(VarintError::Overflow));
        assert_eq!(
            get32(&[0xff, 0xff, 0xff, 0xff, 0x7f]),
            Err(VarintError::Overflow)
        );
        // Eleven bytes, and a tenth byte carrying more than a u64's top bit.
        let mut long = vec![0x80; 10];
        long.push(0);
        assert_eq!(get64(&long), Err(VarintError::Overlong));
        let mut wide = vec![0xff; 9];
        wide.push(0x02);
        assert_eq!(get64(&wide), Err(VarintError::Overflow));
        wide[9] = 0x01;
        assert_eq!(get64(&wide), Ok(u64::MAX));
        // Padding: the lenient reading takes it, the canonical one refuses it.
        assert_eq!(get32(&[0x80, 0x00]), Ok(0));
        assert_eq!(get32(&[0x81, 0x80, 0x00]), Ok(1));
        let canonical = |bytes: &[u8]| get_canonical_u32(&mut &bytes[..]);
        assert_eq!(canonical(&[0]), Ok(0));
        assert_eq!(canonical(&[0x80, 0x00]), Err(VarintError::Overlong));
        assert_eq!(canonical(&[0x81, 0x80, 0x00]), Err(VarintError::Overlong));
        assert_eq!(canonical(&[0x80, 0x80]), Err(VarintError::Truncated));
    }

    /// `value`'s encoding stretched to `len` bytes with zero groups (`len` at least its length).
    fn padded(value: u64, len: usize) -> Vec<u8> {
        let mut bytes = encode(value);
        while bytes.len() < len {
            *bytes.last_mut().unwrap() |= 0x80;
            bytes.push(0);
        }
        bytes
    }

    proptest! {
        #[test]
        fn round_trips_u64(value in any::<u64>(), rest in proptest::collection::vec(any::<u8>(), 0..4)) {
            let mut bytes = encode(value);
            prop_assert_eq!(bytes.len(), encoded_len(value));
            bytes.extend_from_slice(&rest);
            let mut input = &bytes[..];
            prop_assert_eq!(get_u64(&mut input), Ok(value));
            prop_assert_eq!(input, &rest[..]);
        }

        #[test]
        fn round_trips_u32(value in any::<u32>(), rest in proptest::collection::vec(any::<u8>(), 0..4)) {
            let mut bytes = encode(value.into());
            prop_assert!(bytes.len() <= MAX_LEN_U32);
            bytes.extend_from_slice(&rest);
            for get in [get_u32, get_canonical_u32] {
                let mut input = &bytes[..];
                prop_assert_eq!(get(&mut input), Ok(value));
                prop_assert_eq!(input, &rest[..]);
            }
        }

        #[test]
        fn a_cut_varint_is_truncated_and_consumes_nothing(value in any::<u64>(), cut in any::<prop::sample::Index>()) {
            let bytes = encode(value);
            let cut = &bytes[..cut.index(bytes.len())];
            let mut input = cut;
            prop_assert_eq!(get_u64(&mut input), Err(VarintError::Truncated));
            prop_assert_eq!(input, cut);
            if value <= u64::from(u32::MAX) {
                let mut input = cut;
                prop_assert_eq!(get_canonical_u32(&mut input), Err(VarintError::Truncated));
            }
        }

        #[test]
        fn padding_within_the_type_is_lenient_but_not_canonical(
            value in any::<u32>(),
            extra in 1usize..=MAX_LEN_U32,
        ) {
            let len = encoded_len(value.into()) + extra;
            let bytes = padded(value.into(), len);
            let expected = if len <= MAX_LEN_U32 { Ok(value) } else { Err(VarintError::Overlong) };
            prop_assert_eq!(get_u32(&mut &bytes[..]), expected);
            prop_assert_eq!(get_canonical_u32(&mut &bytes[..]), Err(VarintError::Overlong));
        }

        #[test]
        fn longer_than_the_type_is_overlong(value in any::<u64>(), extra in 1usize..4) {
            let bytes = padded(value, MAX_LEN_U64 + extra);
            prop_assert_eq!(get_u64(&mut &bytes[..]), Err(VarintError::Overlong));
            let bytes = padded(value & 0xffff, MAX_LEN_U32 + extra);
            prop_assert_eq!(get_u32(&mut &bytes[..]), Err(VarintError::Overlong));
        }

        #[test]
        fn values_past_u32_overflow_a_u32(value in (1u64 << 32)..) {
            let bytes = encode(value);
            let expected = if bytes.len() <= MAX_LEN_U32 {
                VarintError::Overflow
            } else {
                VarintError::Overlong
            };
            prop_assert_eq!(get_u32(&mut &bytes[..]), Err(expected));
            prop_assert_eq!(get_canonical_u32(&mut &bytes[..]), Err(expected));
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_consume_what_they_decode(
            bytes in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            let mut input = &bytes[..];
            if let Ok(value) = get_u64(&mut input) {
                let used = bytes.len() - input.len();
                prop_assert!(used <= MAX_LEN_U64);
                prop_assert_eq!(bytes[used - 1] & 0x80, 0);
                prop_assert!(used >= encoded_len(value));
            } else {
                prop_assert_eq!(input, &bytes[..]);
            }
            let mut input = &bytes[..];
            if let Ok(value) = get_canonical_u32(&mut input) {
                prop_assert_eq!(&bytes[..bytes.len() - input.len()], &encode(value.into())[..]);
            }
        }
    }
}
