//! The bytes of an aggregated message: records, each `[kind u16][0 u16][len u32][key u64]`
//! (little-endian) followed by `len` bytes of items that the kind's functions parse.

/// Bytes of a record's header.
pub const HEADER: usize = 16;

/// One record of a message.
#[derive(Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub kind: u16,
    pub key: u64,
    pub items: &'a [u8],
}

/// Writes a header for `kind` and `key` with a length to be patched by [`close`].
#[inline]
pub fn open(buf: &mut Vec<u8>, kind: u16, key: u64) -> usize {
    let at = buf.len();
    buf.extend_from_slice(&kind.to_le_bytes());
    buf.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    buf.extend_from_slice(&key.to_le_bytes());
    at
}

/// Sets the length of the record whose header is at `at` to what follows it in `buf`.
#[inline]
pub fn close(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at - HEADER) as u32;
    buf[at + 4..at + 8].copy_from_slice(&len.to_le_bytes());
}

/// The records of `msg`, or `Err` at the first malformed one (a short header, a length past the
/// end, a non-zero reserved field).
pub fn records(msg: &[u8]) -> impl Iterator<Item = Result<Record<'_>, &'static str>> {
    let mut rest = msg;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        if rest.len() < HEADER {
            rest = &[];
            return Some(Err("a record header is cut short"));
        }
        let kind = u16::from_le_bytes([rest[0], rest[1]]);
        let reserved = u16::from_le_bytes([rest[2], rest[3]]);
        let len = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes")) as usize;
        let key = u64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
        if reserved != 0 || len > rest.len() - HEADER {
            rest = &[];
            return Some(Err("a record's length runs past the message"));
        }
        let items = &rest[HEADER..HEADER + len];
        rest = &rest[HEADER + len..];
        Some(Ok(Record { kind, key, items }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_forged_lengths_are_refused() {
        let mut b = Vec::new();
        let a = open(&mut b, 3, 7);
        b.extend_from_slice(&[1, 2, 3]);
        close(&mut b, a);
        let c = open(&mut b, 4, u64::MAX);
        close(&mut b, c);
        let got: Vec<_> = records(&b).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            got,
            vec![
                Record { kind: 3, key: 7, items: &[1, 2, 3] },
                Record { kind: 4, key: u64::MAX, items: &[] }
            ]
        );
        // A length one byte too long, and a cut header.
        let mut bad = b.clone();
        bad[4] = 4;
        assert!(records(&bad).any(|r| r.is_err()));
        assert!(records(&b[..10]).any(|r| r.is_err()));
        let mut huge = b.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(records(&huge).any(|r| r.is_err()));
    }
}
