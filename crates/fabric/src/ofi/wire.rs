//! The active-message format of the libfabric fabric: a 40-byte header, the arguments, then
//! the payload. Safe code only: decoding is total (any bytes give a message or an error).
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | job key (messages from other jobs are rejected) |
//! | 8..12 | source rank |
//! | 12..14 | handler (for control messages: [`Control`]) |
//! | 14 | class: 0 request, 1 reply, 2 control |
//! | 15 | kind: 0 short, 1 medium, 2 long already written, 3 long carried in the message |
//! | 16 | number of arguments (≤ 16) |
//! | 20..24 | long: target region id |
//! | 24..32 | long: offset in the region |
//! | 32..40 | payload length |

use crate::{AmClass, AM_MAX_ARGS};

/// Bytes of the header.
pub const HEADER: usize = 40;

/// Fabric-internal messages (class 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// The sender finalized: it sends nothing more.
    Finalized = 1,
    /// Wakes a sleeping receiver (after one-sided writes it waits on).
    Wake = 2,
    /// Returns request credits: the header's `len` requests of the receiver were handled.
    Credit = 3,
}

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Arguments only.
    Short,
    /// A payload for the handler.
    Medium,
    /// `len` bytes already written to (region, offset) by RMA before the message.
    LongWritten,
    /// The payload follows and is to be copied to (region, offset) (fabrics without
    /// send-after-write ordering).
    LongCarried,
}

/// A message's class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// An AM of the runtime.
    Am(AmClass),
    /// A [`Control`] message.
    Control,
}

/// The fixed part of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub key: u64,
    pub src: u32,
    pub handler: u16,
    pub class: Class,
    pub kind: Kind,
    pub nargs: u8,
    pub region: u32,
    pub offset: u64,
    pub len: u64,
}

impl Header {
    /// Bytes of the whole message: header, arguments, and the payload where it travels inside.
    pub fn total(&self) -> usize {
        let carried = matches!(self.kind, Kind::Medium | Kind::LongCarried);
        HEADER + 8 * self.nargs as usize + if carried { self.len as usize } else { 0 }
    }

    /// Writes the header and `args` to the front of `out`, which must hold
    /// `HEADER + 8 * args.len()` bytes; returns the bytes written.
    pub fn encode(&self, args: &[u64], out: &mut [u8]) -> usize {
        out[0..8].copy_from_slice(&self.key.to_le_bytes());
        out[8..12].copy_from_slice(&self.src.to_le_bytes());
        out[12..14].copy_from_slice(&self.handler.to_le_bytes());
        out[14] = match self.class {
            Class::Am(AmClass::Request) => 0,
            Class::Am(AmClass::Reply) => 1,
            Class::Control => 2,
        };
        out[15] = match self.kind {
            Kind::Short => 0,
            Kind::Medium => 1,
            Kind::LongWritten => 2,
            Kind::LongCarried => 3,
        };
        out[16] = args.len() as u8;
        out[17..20].fill(0);
        out[20..24].copy_from_slice(&self.region.to_le_bytes());
        out[24..32].copy_from_slice(&self.offset.to_le_bytes());
        out[32..40].copy_from_slice(&self.len.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            out[HEADER + 8 * i..HEADER + 8 * i + 8].copy_from_slice(&a.to_le_bytes());
        }
        HEADER + 8 * args.len()
    }
}

/// A decoded message borrowing its payload.
#[derive(Debug)]
pub struct Decoded<'a> {
    pub header: Header,
    pub args: [u64; AM_MAX_ARGS],
    pub payload: &'a [u8],
}

fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Decodes a received message of job `key` in a job of `size` ranks; the error says what is
/// wrong (for the count of rejected messages and the log).
pub fn decode(b: &[u8], key: u64, size: u32) -> Result<Decoded<'_>, String> {
    if b.len() < HEADER {
        return Err(format!("{} bytes, shorter than a header", b.len()));
    }
    if word(b, 0) != key {
        return Err("foreign job key".into());
    }
    let src = word(b, 8) as u32;
    if src >= size {
        return Err(format!("source rank {src} in a job of {size}"));
    }
    let class = match b[14] {
        0 => Class::Am(AmClass::Request),
        1 => Class::Am(AmClass::Reply),
        2 => Class::Control,
        c => return Err(format!("class {c}")),
    };
    let kind = match b[15] {
        0 => Kind::Short,
        1 => Kind::Medium,
        2 => Kind::LongWritten,
        3 => Kind::LongCarried,
        k => return Err(format!("kind {k}")),
    };
    let nargs = b[16];
    if nargs as usize > AM_MAX_ARGS {
        return Err(format!("{nargs} arguments (at most {AM_MAX_ARGS})"));
    }
    let header = Header {
        key,
        src,
        handler: u16::from_le_bytes([b[12], b[13]]),
        class,
        kind,
        nargs,
        region: u32::from_le_bytes([b[20], b[21], b[22], b[23]]),
        offset: word(b, 24),
        len: word(b, 32),
    };
    let body = HEADER + 8 * nargs as usize;
    let carried = matches!(kind, Kind::Medium | Kind::LongCarried);
    let expect = if carried { (body as u64).checked_add(header.len) } else { Some(body as u64) };
    if expect != Some(b.len() as u64) {
        return Err(format!("{} bytes received, header describes {expect:?}", b.len()));
    }
    let mut args = [0u64; AM_MAX_ARGS];
    for (i, a) in args.iter_mut().take(nargs as usize).enumerate() {
        *a = word(b, HEADER + 8 * i);
    }
    Ok(Decoded { header, args, payload: if carried { &b[body..] } else { &[] } })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(kind: Kind, len: u64) -> Header {
        Header {
            key: 0xfeed,
            src: 3,
            handler: 77,
            class: Class::Am(AmClass::Reply),
            kind,
            nargs: 2,
            region: 5,
            offset: 4096,
            len,
        }
    }

    #[test]
    fn round_trip() {
        let h = sample(Kind::Medium, 3);
        let mut buf = vec![0u8; h.total()];
        let n = h.encode(&[1, u64::MAX], &mut buf);
        buf[n..].copy_from_slice(b"abc");
        let d = decode(&buf, 0xfeed, 4).unwrap();
        assert_eq!(d.header, h);
        assert_eq!(&d.args[..2], &[1, u64::MAX]);
        assert_eq!(d.payload, b"abc");
        let w = sample(Kind::LongWritten, 1 << 40);
        let mut buf = vec![0u8; w.total()];
        w.encode(&[1, 2], &mut buf);
        assert_eq!(decode(&buf, 0xfeed, 4).unwrap().payload, b"");
    }

    #[test]
    fn rejects_what_does_not_add_up() {
        let h = sample(Kind::Medium, 3);
        let mut buf = vec![0u8; h.total()];
        h.encode(&[1, 2], &mut buf);
        assert!(decode(&buf, 0xbad, 4).unwrap_err().contains("foreign"));
        assert!(decode(&buf, 0xfeed, 3).is_err(), "source outside the job");
        assert!(decode(&buf[..buf.len() - 1], 0xfeed, 4).is_err(), "truncated payload");
        let mut long = buf.clone();
        long[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&long, 0xfeed, 4).is_err(), "length overflow");
        let mut many = buf.clone();
        many[16] = 17;
        assert!(decode(&many, 0xfeed, 4).is_err());
        assert!(decode(&buf[..10], 0xfeed, 4).is_err());
    }

    #[test]
    fn decoding_is_total() {
        // Pseudo-random bytes with a valid key: never a panic.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..2000 {
            let mut b: Vec<u8> = (0..(n % 200))
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            if b.len() >= 8 {
                b[..8].copy_from_slice(&7u64.to_le_bytes());
            }
            let _ = decode(&b, 7, 4);
        }
    }
}
