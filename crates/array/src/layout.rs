//! Where a global index lives: block, cyclic and block-cyclic distributions.

use weft_runtime::{Error, Result};

/// How a distributed array's elements are spread over the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Distribution {
    /// Contiguous blocks of `ceil(len / ranks)` elements: rank 0 holds the first block.
    #[default]
    Block,
    /// Element `i` on rank `i % ranks` (round robin).
    Cyclic,
    /// Blocks of the given size dealt round robin (`BlockCyclic(1)` is `Cyclic`).
    BlockCyclic(usize),
}

/// Division by a divisor fixed at creation, by multiplication (Lemire et al.): an index's
/// owner is computed for every element of a batch, and a 64-bit `div` costs 10-40 cycles.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastDiv {
    d: u64,
    /// `u64::MAX / d + 1` where dividends and `d` fit in 32 bits, else 0 (plain division).
    m: u64,
}

impl FastDiv {
    pub fn new(d: u64, max_dividend: u64) -> FastDiv {
        let small = d > 1 && d <= u32::MAX as u64 && max_dividend <= u32::MAX as u64;
        FastDiv { d, m: if small { u64::MAX / d + 1 } else { 0 } }
    }
    /// `(n / d, n % d)`.
    #[inline(always)]
    pub fn divmod(&self, n: u64) -> (u64, u64) {
        if self.m != 0 {
            let q = ((self.m as u128 * n as u128) >> 64) as u64;
            (q, n - q * self.d)
        } else if self.d == 1 {
            (n, 0)
        } else {
            (n / self.d, n % self.d)
        }
    }
}

/// A distribution applied to a length and a number of ranks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub len: usize,
    pub ranks: u32,
    /// Elements per block (the whole share for `Block`).
    pub block: usize,
    cyclic: bool,
    by_block: FastDiv,
    by_ranks: FastDiv,
    /// The largest local part: every rank's segment has this many elements.
    pub local_max: usize,
}

impl Layout {
    pub fn new(len: usize, ranks: u32, dist: Distribution) -> Result<Layout> {
        let p = ranks as usize;
        let (block, cyclic) = match dist {
            Distribution::Block => (len.div_ceil(p).max(1), false),
            Distribution::Cyclic => (1, true),
            Distribution::BlockCyclic(0) => {
                return Err(Error::Misuse("a block-cyclic distribution needs blocks of at least 1 element"))
            }
            Distribution::BlockCyclic(b) => (b, true),
        };
        let blocks = len.div_ceil(block);
        let local_max = if cyclic { blocks.div_ceil(p).checked_mul(block) } else { Some(block) };
        let too_large = Error::TooLarge { what: "array part (elements)", len, max: isize::MAX as usize / 8 };
        let local_max = local_max.filter(|&m| m <= isize::MAX as usize / 8).ok_or(too_large)?;
        let max = len as u64;
        Ok(Layout {
            len,
            ranks,
            block,
            cyclic,
            by_block: FastDiv::new(block as u64, max),
            by_ranks: FastDiv::new(ranks as u64, max),
            local_max: local_max.min(len.max(1)),
        })
    }

    /// The owner of global index `i < len` and the offset in its part.
    #[inline(always)]
    pub fn locate(&self, i: usize) -> (u32, usize) {
        let (blk, within) = self.by_block.divmod(i as u64);
        if !self.cyclic {
            return (blk as u32, within as usize);
        }
        let (round, rank) = self.by_ranks.divmod(blk);
        (rank as u32, (round as usize) * self.block + within as usize)
    }

    /// The global index of offset `off` of rank `rank`'s part.
    pub fn global(&self, rank: u32, off: usize) -> usize {
        if !self.cyclic {
            return rank as usize * self.block + off;
        }
        let (round, within) = (off / self.block, off % self.block);
        (round * self.ranks as usize + rank as usize) * self.block + within
    }

    /// How many elements rank `rank` holds.
    pub fn local_len(&self, rank: u32) -> usize {
        if !self.cyclic {
            let start = rank as usize * self.block;
            return self.len.saturating_sub(start).min(self.block);
        }
        // Full rounds, then this rank's share of the last.
        let p = self.ranks as usize;
        let per_round = p * self.block;
        let (rounds, rest) = (self.len / per_round, self.len % per_round);
        let mine = rest.saturating_sub(rank as usize * self.block).min(self.block);
        rounds * self.block + mine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_has_one_home_and_comes_back() {
        for &(len, p) in &[(0usize, 1u32), (1, 3), (10, 3), (100, 4), (1001, 7), (64, 64)] {
            for dist in [Distribution::Block, Distribution::Cyclic, Distribution::BlockCyclic(3)] {
                let l = Layout::new(len, p, dist).unwrap();
                let mut count = vec![0usize; p as usize];
                for i in 0..len {
                    let (r, off) = l.locate(i);
                    assert!(r < p && off < l.local_max, "{dist:?} {len} {p}: {i} -> ({r}, {off})");
                    assert_eq!(l.global(r, off), i, "{dist:?} {len} {p}");
                    count[r as usize] += 1;
                }
                for r in 0..p {
                    assert_eq!(count[r as usize], l.local_len(r), "{dist:?} {len} {p} rank {r}");
                }
            }
        }
    }

    #[test]
    fn fast_division_matches_plain_division() {
        for d in [1u64, 2, 3, 7, 10, 1000, 65537, u32::MAX as u64] {
            let f = FastDiv::new(d, u32::MAX as u64);
            for n in [0u64, 1, 2, 99, 12345, 1 << 31, u32::MAX as u64 - 1, u32::MAX as u64] {
                assert_eq!(f.divmod(n), (n / d, n % d), "{n} / {d}");
            }
        }
        assert!(Layout::new((1 << 63) + 1, 1, Distribution::BlockCyclic(1 << 63)).is_err());
        assert!(Layout::new(usize::MAX, 2, Distribution::Block).is_err());
        let big = FastDiv::new(3, u64::MAX);
        assert_eq!(big.divmod(u64::MAX), (u64::MAX / 3, u64::MAX % 3));
    }
}
