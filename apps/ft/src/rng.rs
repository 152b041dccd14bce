//! The NAS random number generator: x(k+1) = a·x(k) mod 2^46, a = 5^13, each output x·2^-46.
//!
//! NPB computes this with split double-precision arithmetic; here it is exact integer
//! arithmetic: 2^46 divides 2^64, so a wrapping 64-bit product reduced mod 2^46 is exact.

/// The multiplier a = 5^13.
pub const MULTIPLIER: u64 = 1_220_703_125;
/// NPB FT's seed.
pub const SEED: u64 = 314_159_265;
const MASK: u64 = (1 << 46) - 1;
const SCALE: f64 = 1.0 / (1u64 << 46) as f64;

fn mul(a: u64, b: u64) -> u64 {
    a.wrapping_mul(b) & MASK
}

/// a^n mod 2^46, by squaring.
pub fn pow(mut a: u64, mut n: u64) -> u64 {
    let mut r = 1;
    while n > 0 {
        if n & 1 == 1 {
            r = mul(r, a);
        }
        a = mul(a, a);
        n >>= 1;
    }
    r
}

/// A position in the stream started at [`SEED`].
#[derive(Clone, Copy, Debug)]
pub struct Stream {
    x: u64,
}

impl Stream {
    /// The stream after `n` steps: the next value is the (n+1)-th output.
    pub fn at(n: u64) -> Stream {
        Stream { x: mul(SEED, pow(MULTIPLIER, n)) }
    }
    /// The next output, in [0, 1).
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        self.x = mul(MULTIPLIER, self.x);
        self.x as f64 * SCALE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_equals_stepping() {
        let mut s = Stream::at(0);
        let stepped: Vec<f64> = (0..1000).map(|_| s.next_f64()).collect();
        for n in [0u64, 1, 7, 500, 999] {
            assert_eq!(Stream::at(n).next_f64(), stepped[n as usize]);
        }
    }

    #[test]
    fn first_value_is_a_times_seed() {
        let v = Stream::at(0).next_f64();
        let x = (MULTIPLIER as u128 * SEED as u128) % (1u128 << 46);
        assert_eq!(v, x as f64 / (1u64 << 46) as f64);
        assert!(v > 0.0 && v < 1.0);
    }

    #[test]
    fn pow_matches_repeated_multiplication() {
        let mut r = 1u64;
        for n in 0..300u64 {
            assert_eq!(pow(MULTIPLIER, n), r);
            r = ((r as u128 * MULTIPLIER as u128) % (1u128 << 46)) as u64;
        }
    }
}
