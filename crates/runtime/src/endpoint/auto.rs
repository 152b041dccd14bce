//! [`EndpointPolicy::Auto`]: measure every category on this rank and take the cheapest one
//! within the tolerance of the fastest.
//!
//! The measurement is local: `threads` threads post 8-byte inline puts through each
//! category's queues, locks and completion structures into a region of this rank, for 3 ms at a
//! time, in five rounds over all categories (the best of each counts). It needs no peer, so ranks decide independently and
//! creation stays one collective call. Without native RMA there is nothing local to measure
//! and Auto takes `Dynamic`.

use super::queue::Knobs;
use super::set::{build, EndpointResources};
use super::{EndpointConfig, EndpointPolicy, Layout};
use crate::{Comm, Result};
use std::time::{Duration, Instant};

/// How long each trial posts.
const TRIAL: Duration = Duration::from_millis(3);
const TRIALS: usize = 5;

/// The chosen category and the rate measured for each (operations/s).
pub(super) fn choose(
    comm: &Comm,
    cfg: &EndpointConfig,
) -> Result<(EndpointPolicy, Vec<(EndpointPolicy, f64)>)> {
    if !comm.native_rma {
        return Ok((EndpointPolicy::Dynamic, Vec::new()));
    }
    let region = comm.fabric.register(cfg.threads * 64)?;
    let target = comm.fabric.attach(comm.rank(), &region.desc)?;
    comm.fabric.seal(&region)?;
    let knobs = Knobs {
        postlist: cfg.postlist,
        signal_every: cfg.signal_every as u64,
        inline_max: cfg.inline_max.max(8),
    };
    // Rounds over all categories, best of each: noise (other processes, the other ranks
    // calibrating at the same time) then hits every category alike.
    let mut measured: Vec<(EndpointPolicy, f64)> =
        EndpointPolicy::CATEGORIES.iter().map(|&p| (p, 0.0)).collect();
    let mut run = || -> Result<()> {
        for _ in 0..TRIALS {
            for (policy, best) in measured.iter_mut() {
                let layout = Layout::new(*policy, cfg.threads, cfg.cq, cfg.static_slots);
                *best = best.max(trial(comm, &layout, knobs, &target)?);
            }
        }
        Ok(())
    };
    let r = run();
    comm.fabric.deregister(&region);
    r?;
    let fastest = measured.iter().map(|m| m.1).fold(0.0, f64::max);
    let cost = |p: EndpointPolicy| {
        EndpointResources::new(
            Layout::new(p, cfg.threads, cfg.cq, cfg.static_slots),
            comm.size() as usize,
            cfg,
        )
        .bytes
    };
    let chosen = measured
        .iter()
        .filter(|m| m.1 >= fastest * (1.0 - cfg.tolerance))
        .min_by_key(|m| cost(m.0))
        .map_or(EndpointPolicy::Dynamic, |m| m.0);
    Ok((chosen, measured))
}

/// Operations per second of `layout`'s endpoints, all posting at once.
fn trial(comm: &Comm, layout: &Layout, knobs: Knobs, target: &weft_fabric::RemoteRegion) -> Result<f64> {
    let slots = layout.slots_per_context.iter().map(|&s| (0..s).map(|_| None).collect()).collect();
    let endpoints = build(comm, layout, knobs, slots);
    // Every endpoint here is private to this function: nothing to close.
    let start = Instant::now();
    let counts = std::thread::scope(|s| {
        let workers: Vec<_> = endpoints
            .into_iter()
            .map(|mut ep| {
                s.spawn(move || -> Result<u64> {
                    let off = ep.index() * 64;
                    let to = super::queue::Target { rank: comm.rank(), seg: u32::MAX, region: *target, off };
                    let begin = Instant::now();
                    let mut n = 0u64;
                    while begin.elapsed() < TRIAL {
                        for _ in 0..256 {
                            ep.post_put_bytes(to, &n.to_le_bytes())?;
                            n += 1;
                        }
                    }
                    ep.flush()?;
                    Ok(n)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or(Ok(0))).collect::<Result<Vec<u64>>>()
    })?;
    Ok(counts.iter().sum::<u64>() as f64 / start.elapsed().as_secs_f64())
}
