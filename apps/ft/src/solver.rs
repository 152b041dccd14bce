//! The FT driver: initial conditions, forward transform, time steps, checksums, timing.

use crate::class::Class;
use crate::exchange::{Inbox, Mailbox, OneSided, Shape, Transport, TwoSided, POINT};
use crate::local_fft::{Direction, C64};
use crate::report::{Report, Times, Verification};
use crate::rng::Stream;
use crate::transform::{Counters, Transform};
use crate::{Error, Model, Variant};
use rustfft::FftPlanner;
use std::sync::{Arc, Mutex};
use weft_fabric::os::{mem_available, now_ns};
use weft_runtime::{ReduceOp, Segment, Team, World};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Problem class.
    pub class: Class,
    /// How the transposes are spread over the computation.
    pub variant: Variant,
    /// How data reaches its owner.
    pub model: Model,
    /// Columns transformed together along the second dimension (and, for pencils, sent one
    /// by one as they are done).
    pub columns: usize,
    /// Run one untimed forward and inverse transform first, touching every page (as NPB's
    /// warm-up call does).
    pub warm_up: bool,
    /// Unused points after each row of the arrays accessed with non-unit stride, so that a
    /// column's points do not all map to the same cache sets (the paper's padding option).
    pub pad: usize,
}

impl Options {
    /// Defaults for a class, variant and model.
    pub fn new(class: Class, variant: Variant, model: Model) -> Options {
        Options { class, variant, model, columns: 16, warm_up: true, pad: DEFAULT_PAD }
    }
}

/// FT's per-world state: the two-sided handler (registered before `init`) and the receive
/// buffers, kept for the next run of the same world (segments live as long as the world).
pub struct Ft {
    mailbox: Arc<Mailbox>,
    buffers: Mutex<Option<Buffers>>,
    epoch: Mutex<u64>,
}

/// A rank's receive buffers and its one-sided completion flags.
type Buffers = (Arc<Inbox>, Arc<Segment<u64>>);

/// Default row padding, points (see [`Options::pad`]). None: on this machine padding by 8
/// made the gather of 16 columns from a 256-wide plane 30% faster in isolation, but whole
/// class A and B runs showed no difference beyond noise (the planes are cache-resident after
/// the row FFTs), and padded rows are transformed one call per row instead of batched.
pub const DEFAULT_PAD: usize = 0;

/// α of the diffusion equation.
const ALPHA: f64 = 1e-6;

impl Ft {
    /// Registers FT's message handler on `b`; call before `init`.
    pub fn register(b: &mut weft_runtime::Builder) -> Ft {
        Ft { mailbox: Mailbox::register(b), buffers: Mutex::new(None), epoch: Mutex::new(0) }
    }

    /// Runs the benchmark on every rank of `world` (collective) and returns the figures,
    /// reduced over the ranks.
    pub fn run(&self, world: &World, opts: &Options) -> Result<Report, Error> {
        let [nx, ny, nz] = opts.class.dims();
        let (p, me) = (world.size() as usize, world.rank() as usize);
        if [nx, ny, nz].iter().any(|d| d % p != 0) {
            return Err(Error::Setup(format!(
                "class {} ({nx}×{ny}×{nz}) needs a number of ranks that divides every dimension; {p} does not",
                opts.class
            )));
        }
        let points = opts.class.points() / p;
        let pad = opts.pad;
        let row = [nx + pad, ny + pad, nz + pad];
        // Input planes [c/P][b][a + pad] and output rows [b/P][a][c + pad] of both transforms.
        let len = [(nz / p) * ny * row[0], (ny / p) * nx * row[2], (nx / p) * nz * row[1]];
        let len = len.into_iter().max().unwrap_or(0);
        self.check_memory(points, len, p, opts.variant)?;
        let (inbox, flags) = self.buffers(world, points)?;
        let mut xport: Box<dyn Transport> = match opts.model {
            Model::OneSided => Box::new(OneSided::new(world.arc(), inbox, flags)),
            Model::TwoSided => Box::new(TwoSided::new(world.arc(), self.mailbox.clone(), inbox)),
        };
        let team = world.world_team()?;
        let mut planner = FftPlanner::new();
        let fwd = Shape { a: nx, b: ny, c: nz, ranks: p, me };
        let inv = Shape { a: nz, b: nx, c: ny, ranks: p, me };
        let mut fwd = Transform::new(&mut planner, fwd, Direction::Forward, opts.columns, pad);
        let mut inv = Transform::new(&mut planner, inv, Direction::Inverse, opts.columns, pad);
        let mut buf = touched(len);
        let mut u0 = touched(len);
        let mut stage = vec![];
        let mut epoch = self.epoch.lock().unwrap_or_else(|e| e.into_inner());
        let mut next_epoch = || {
            *epoch += 1;
            *epoch
        };

        if opts.warm_up {
            let mut scratch = Counters::default();
            initial_conditions(&mut buf, [nx, ny, nz], row[0], me, p);
            fwd.run(&mut buf, None, opts.variant, &mut *xport, next_epoch(), &mut stage, &mut scratch)?;
            inv.run(&mut buf, None, opts.variant, &mut *xport, next_epoch(), &mut stage, &mut scratch)?;
        }
        world.barrier()?;

        let mut count = Counters::default();
        let start = now_ns();
        initial_conditions(&mut buf, [nx, ny, nz], row[0], me, p);
        fwd.run(&mut buf, None, opts.variant, &mut *xport, next_epoch(), &mut stage, &mut count)?;
        std::mem::swap(&mut buf, &mut u0);
        let mut checksums = Vec::with_capacity(opts.class.iterations());
        for t in 1..=opts.class.iterations() {
            let mut step = evolve(&u0, [nx, ny, nz], row[2], t, me, p);
            inv.run(
                &mut buf,
                Some(&mut step),
                opts.variant,
                &mut *xport,
                next_epoch(),
                &mut stage,
                &mut count,
            )?;
            checksums.push(checksum(&team, &buf, [nx, ny, nz], row[1], me, p)?);
        }
        let elapsed = (now_ns() - start) as f64 * 1e-9;

        let (init, done) = (count.initiation_ns as f64 * 1e-9, count.completion_ns as f64 * 1e-9);
        let m = team.allreduce(&[elapsed, init + done, elapsed - init - done, init, done], ReduceOp::Max)?;
        let traffic = team.allreduce(&[count.messages, count.bytes], ReduceOp::Max)?;
        let verification = Verification::check(opts.class, &checksums);
        let times = Times { total: m[0], comm: m[1], compute: m[2], initiation: m[3], completion: m[4] };
        Ok(Report::new(opts, p, times, [traffic[0], traffic[1]], checksums, verification))
    }

    /// The receive buffers for `points` per rank: the last run's if large enough.
    fn buffers(&self, world: &World, points: usize) -> Result<Buffers, Error> {
        let mut held = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((inbox, flags)) = held.as_ref() {
            if inbox.points() >= points {
                return Ok((inbox.clone(), flags.clone()));
            }
        }
        let seg = world.alloc_segment::<u8>(Inbox::bytes(points))?;
        let flags = match held.take() {
            Some((_, flags)) => flags,
            None => Arc::new(world.alloc_segment::<u64>(world.size() as usize)?),
        };
        let inbox = Arc::new(Inbox::new(seg, points));
        *held = Some((inbox.clone(), flags.clone()));
        Ok((inbox, flags))
    }

    /// Fails before allocating anything if the ranks of this node would need more memory
    /// than the kernel says is available.
    fn check_memory(
        &self,
        points: usize,
        padded: usize,
        ranks: usize,
        variant: Variant,
    ) -> Result<(), Error> {
        // Two padded work arrays, the two-buffer inbox, the exchange's staging array.
        let staging = if variant == Variant::Exchange { points } else { 0 };
        let need = (2 * padded + 2 * points + staging) as u128 * POINT as u128 * ranks as u128;
        match mem_available() {
            Some(avail) if need > avail as u128 => Err(Error::Setup(format!(
                "{} ranks need {:.1} GiB for their arrays; {:.1} GiB are available",
                ranks,
                need as f64 / (1u64 << 30) as f64,
                avail as f64 / (1u64 << 30) as f64
            ))),
            _ => Ok(()),
        }
    }
}

/// A zeroed vector whose pages are written now, not on first use in the timed region.
fn touched(n: usize) -> Vec<C64> {
    let mut v = Vec::with_capacity(n);
    v.resize(n, C64::new(0.0, 0.0));
    v
}

/// u0 on this rank's planes (`[k][j][i]`, rows `row` apart, planes `me·nz/p ..`): the
/// element at linear index L = k·nx·ny + j·nx + i is (value 2L+1, value 2L+2) of the NAS
/// stream.
fn initial_conditions(buf: &mut [C64], [nx, ny, nz]: [usize; 3], row: usize, me: usize, p: usize) {
    let k0 = me * nz / p;
    for kl in 0..nz / p {
        let mut s = Stream::at(2 * ((k0 + kl) * nx * ny) as u64);
        for r in buf[kl * ny * row..(kl + 1) * ny * row].chunks_exact_mut(row) {
            for v in &mut r[..nx] {
                let re = s.next_f64();
                *v = C64::new(re, s.next_f64());
            }
        }
    }
}

/// exp(−4απ²·t·m̄²) for m = 0..n, with m̄ = ((m + n/2) mod n) − n/2.
fn decay(n: usize, t: usize) -> Vec<f64> {
    let ap = -4.0 * ALPHA * std::f64::consts::PI * std::f64::consts::PI;
    (0..n)
        .map(|m| {
            let mb = ((m + n / 2) % n) as f64 - (n / 2) as f64;
            (ap * t as f64 * mb * mb).exp()
        })
        .collect()
}

/// Time step `t` of the transformed data `u0` (`[j][i][k]`, rows of k `row` apart, j from
/// `me·ny/p`), one k-row at a time: `(j_local, i, out)` writes row (j, i) into `out`.
fn evolve<'a>(
    u0: &'a [C64],
    [nx, ny, nz]: [usize; 3],
    row: usize,
    t: usize,
    me: usize,
    p: usize,
) -> impl FnMut(usize, usize, &mut [C64]) + 'a {
    let (ex, ey, ez) = (decay(nx, t), decay(ny, t), decay(nz, t));
    let j0 = me * ny / p;
    move |jl, i, out| {
        let fij = ey[j0 + jl] * ex[i];
        let src = &u0[(jl * nx + i) * row..][..nz];
        for ((d, s), fk) in out.iter_mut().zip(src).zip(&ez) {
            *d = s * (fij * fk);
        }
    }
}

/// NPB's checksum of the inverse-transformed data `y` (`[i][k][j]`, rows of j `row` apart, i
/// from `me·nx/p`): the sum over j = 1..1024 of y(j mod nx, 3j mod ny, 5j mod nz), over all
/// ranks, / N.
fn checksum(
    team: &Team,
    y: &[C64],
    [nx, ny, nz]: [usize; 3],
    row: usize,
    me: usize,
    p: usize,
) -> Result<[f64; 2], Error> {
    let il = nx / p;
    let i0 = me * il;
    let mut sum = C64::new(0.0, 0.0);
    for j in 1..=1024usize {
        let (i, jj, k) = (j % nx, (3 * j) % ny, (5 * j) % nz);
        if (i0..i0 + il).contains(&i) {
            sum += y[((i - i0) * nz + k) * row + jj];
        }
    }
    let total = team.allreduce(&[sum.re, sum.im], ReduceOp::Sum)?;
    let n = (nx * ny * nz) as f64;
    Ok([total[0] / n, total[1] / n])
}
