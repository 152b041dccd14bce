//! One distributed 3-D FFT: local 2-D FFTs on this rank's planes, the transpose (how depends
//! on the [`Variant`]), then the last 1-D FFTs on the received data.
//!
//! Input `[c/P][b][a]`, output `[b/P][a][c]` (see [`Shape`]). For each local plane: FFTs
//! along `a` (contiguous rows), then along `b` in blocks of columns gathered into a scratch
//! where each column is contiguous. A column's part for rank `s` (its `b/P` rows) is what the
//! variants move:
//! - `Exchange` stores it in a staging array `[s][c/P][a][b/P]` and sends each rank its part
//!   in one message after the last plane (NPB's bulk all-to-all);
//! - `Slabs` stores it in a plane staging array `[s][a][b/P]` and sends each rank its slab as
//!   soon as the plane is done;
//! - `Pencils` sends it at once, straight from the scratch: one message per column and rank.
//!
//! Received data is `[c][a][b/P]` in every variant, so the last FFTs (along `c`) gather
//! blocks of `b/P` rows, transpose them to unit stride and write the output.

use crate::exchange::{Pattern, Shape, Transport, POINT};
use crate::local_fft::{gather_columns, transpose, Direction, Lines, C64};
use crate::{Error, Variant};
use rustfft::FftPlanner;
use weft_fabric::os::now_ns;

/// Communication done by this rank, summed over transforms. The time inside communication
/// calls is the part of the communication that did not overlap computation; copying this
/// rank's own part into its own buffer is local work and is not counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// Time starting sends to other ranks (and posting receives), ns.
    pub initiation_ns: u64,
    /// Time completing: progress calls and the wait at the end of each transform, ns.
    pub completion_ns: u64,
    /// Messages sent to other ranks.
    pub messages: u64,
    /// Bytes sent to other ranks.
    pub bytes: u64,
}

/// Produces input row `row` of local plane `plane` into the slice (see [`Transform::run`]).
pub type RowSource<'a> = dyn FnMut(usize, usize, &mut [C64]) + 'a;

/// Plans and scratch for one distributed transform shape and direction.
pub struct Transform {
    shape: Shape,
    /// Distance between input rows (≥ a; more pads the non-unit-stride accesses).
    in_row: usize,
    /// Distance between output rows (≥ c).
    out_row: usize,
    along_a: Lines,
    along_b: Lines,
    along_c: Lines,
    columns: usize,
    cols: Vec<C64>,
    tmp: Vec<C64>,
}

/// Columns per gathered block in the last stage.
const LAST_BLOCK: usize = 16;

impl Transform {
    /// A transform of `shape` in direction `dir`, gathering `columns` columns at a time, with
    /// `pad` unused points after each input row (of `a`) and each output row (of `c`): the
    /// padding the paper used so that column accesses do not all fall in the same cache sets.
    pub fn new(
        planner: &mut FftPlanner<f64>,
        shape: Shape,
        dir: Direction,
        columns: usize,
        pad: usize,
    ) -> Transform {
        let columns = columns.clamp(1, shape.a);
        let scratch = (columns * shape.b).max(LAST_BLOCK * shape.c);
        Transform {
            shape,
            in_row: shape.a + pad,
            out_row: shape.c + pad,
            along_a: Lines::new(planner, shape.a, dir),
            along_b: Lines::new(planner, shape.b, dir),
            along_c: Lines::new(planner, shape.c, dir),
            columns,
            cols: vec![C64::default(); scratch],
            tmp: vec![C64::default(); LAST_BLOCK * shape.c],
        }
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Points of the (padded) input layout `[c/P][b][a + pad]`.
    pub fn input_len(&self) -> usize {
        self.shape.c_local() * self.shape.b * self.in_row
    }

    /// Points of the (padded) output layout `[b/P][a][c + pad]`.
    pub fn output_len(&self) -> usize {
        self.shape.b_local() * self.shape.a * self.out_row
    }

    /// How `variant` splits a rank's part into messages.
    pub fn pattern(&self, variant: Variant) -> Pattern {
        let s = &self.shape;
        match variant {
            Variant::Exchange => Pattern { count: 1, unit: s.c_local() * s.a * s.b_local() },
            Variant::Slabs => Pattern { count: s.c_local(), unit: s.a * s.b_local() },
            Variant::Pencils => Pattern { count: s.c_local() * s.a, unit: s.b_local() },
        }
    }

    /// Transforms `buf` (input layout in, output layout out) as epoch `epoch` of `xport`.
    /// `stage` is staging space the exchange and slab variants grow as they need. With
    /// `fill`, the input is produced here, row by row: `fill(plane, row, out)` writes input
    /// row `row` of local plane `plane`, which is transformed at once while it is in cache
    /// (one pass over memory fewer than producing the whole input first).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        buf: &mut [C64],
        mut fill: Option<&mut RowSource<'_>>,
        variant: Variant,
        xport: &mut dyn Transport,
        epoch: u64,
        stage: &mut Vec<C64>,
        count: &mut Counters,
    ) -> Result<(), Error> {
        let s = self.shape;
        let (a, b, p, bl, cl) = (s.a, s.b, s.ranks, s.b_local(), s.c_local());
        assert!(buf.len() >= self.input_len().max(self.output_len()), "buffer size");
        let row = self.in_row;
        let pattern = self.pattern(variant);
        let need = match variant {
            Variant::Exchange => s.local_points(),
            Variant::Slabs => a * b,
            Variant::Pencils => 0,
        };
        if stage.len() < need {
            stage.resize(need, C64::default());
        }
        let mut out = Sender { xport, shape: s, pattern, count };
        out.initiate(|x| x.begin(epoch, s, pattern))?;
        for c in 0..cl {
            let plane = &mut buf[c * b * row..(c + 1) * b * row];
            match fill.as_deref_mut() {
                Some(f) => {
                    for (bi, r) in plane.chunks_exact_mut(row).enumerate() {
                        f(c, bi, &mut r[..a]);
                        self.along_a.run(&mut r[..a]);
                    }
                }
                None if row == a => self.along_a.run(plane),
                None => plane.chunks_exact_mut(row).for_each(|r| self.along_a.run(&mut r[..a])),
            }
            for a0 in (0..a).step_by(self.columns) {
                let w = self.columns.min(a - a0);
                gather_columns(plane, row, a0, w, &mut self.cols);
                self.along_b.run(&mut self.cols[..w * b]);
                for k in 0..w {
                    let col = &self.cols[k * b..(k + 1) * b];
                    for (r, part) in col.chunks_exact(bl).enumerate() {
                        match variant {
                            Variant::Exchange => {
                                let at = ((r * cl + c) * a + a0 + k) * bl;
                                stage[at..at + bl].copy_from_slice(part);
                            }
                            Variant::Slabs => {
                                let at = (r * a + a0 + k) * bl;
                                stage[at..at + bl].copy_from_slice(part);
                            }
                            Variant::Pencils => out.emit(r, c * a + a0 + k, part)?,
                        }
                    }
                }
            }
            if variant == Variant::Slabs {
                for r in 0..p {
                    out.emit(r, c, &stage[r * a * bl..(r + 1) * a * bl])?;
                }
            }
            out.complete(|x| x.progress())?;
        }
        if variant == Variant::Exchange {
            let part = cl * a * bl;
            for r in 0..p {
                out.emit(r, 0, &stage[r * part..(r + 1) * part])?;
            }
        }
        out.complete(|x| x.finish())?;
        self.last_stage(buf, xport);
        Ok(())
    }

    /// FFTs along `c` of the received `[c][a][b/P]` data, written as `[b/P][a][c + pad]` into
    /// `buf`.
    fn last_stage(&mut self, buf: &mut [C64], xport: &dyn Transport) {
        let s = self.shape;
        let (a, c, bl) = (s.a, s.c, s.b_local());
        let (inbox, epoch) = xport.inbox();
        let (view, base) = (inbox.view(), inbox.base(epoch));
        for ai in 0..a {
            for b0 in (0..bl).step_by(LAST_BLOCK) {
                let w = LAST_BLOCK.min(bl - b0);
                for ci in 0..c {
                    let from = base + ((ci * a + ai) * bl + b0) * POINT;
                    view.copy_out(from, bytemuck::cast_slice_mut(&mut self.tmp[ci * w..(ci + 1) * w]));
                }
                transpose(&self.tmp, c, w, &mut self.cols);
                self.along_c.run(&mut self.cols[..w * c]);
                for k in 0..w {
                    let at = ((b0 + k) * a + ai) * self.out_row;
                    buf[at..at + c].copy_from_slice(&self.cols[k * c..(k + 1) * c]);
                }
            }
        }
    }
}

/// Sends messages through a transport, keeping this rank's own part and timing every call.
struct Sender<'a> {
    xport: &'a mut dyn Transport,
    shape: Shape,
    pattern: Pattern,
    count: &'a mut Counters,
}

impl Sender<'_> {
    fn initiate(&mut self, f: impl FnOnce(&mut dyn Transport) -> Result<(), Error>) -> Result<(), Error> {
        timed(&mut self.count.initiation_ns, || f(&mut *self.xport))
    }

    fn complete(&mut self, f: impl FnOnce(&mut dyn Transport) -> Result<(), Error>) -> Result<(), Error> {
        timed(&mut self.count.completion_ns, || f(&mut *self.xport))
    }

    fn emit(&mut self, dst: usize, index: usize, data: &[C64]) -> Result<(), Error> {
        if dst == self.shape.me {
            self.xport.keep(index, data, &self.shape, &self.pattern);
            return Ok(());
        }
        self.count.messages += 1;
        self.count.bytes += std::mem::size_of_val(data) as u64;
        self.initiate(|x| x.send(dst, index, data))
    }
}

/// Runs `f`, adding the nanoseconds it took to `ns`.
fn timed<R>(ns: &mut u64, f: impl FnOnce() -> R) -> R {
    let t = now_ns();
    let r = f();
    *ns += now_ns() - t;
    r
}
