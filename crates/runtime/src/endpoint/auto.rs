//! [`EndpointPolicy::Auto`]: measure every category on this rank and take the cheapest one
//! within the tolerance of the fastest.
//!
//! The measurement is local: `threads` threads post 8-byte inline puts through each
//! category's queues, locks and completion structures into a region of this rank, for 8 ms at
//! a time, in five rounds over all categories (the best of each counts). Ranks that ask for the
//! same configuration share one measurement, taken by the first of them, and measurements
//! run one at a time: ranks calibrating at once would share the cores and measure each other.
//! Without native RMA there is nothing local to measure and Auto takes `Dynamic`.

use super::queue::Knobs;
use super::set::{build, EndpointResources};
use super::{EndpointConfig, EndpointPolicy, Layout};
use crate::{Comm, Result};
use std::time::{Duration, Instant};

/// How long each trial posts.
const TRIAL: Duration = Duration::from_millis(8);
const TRIALS: usize = 5;

/// A category and the rate measured for each (operations/s).
pub(super) type Choice = (EndpointPolicy, Vec<(EndpointPolicy, f64)>);

/// Collective: every rank's category, Auto resolved (see the module documentation).
pub(super) fn resolve(comm: &Comm, cfg: &EndpointConfig) -> Result<Choice> {
    let key = match cfg.policy {
        EndpointPolicy::Auto => format!(
            "{} {:?} {} {} {} {} {}",
            cfg.threads,
            cfg.cq,
            cfg.postlist,
            cfg.signal_every,
            cfg.inline_max,
            cfg.static_slots,
            cfg.tolerance
        ),
        _ => String::new(),
    };
    let keys = comm.exchange(key.as_bytes())?;
    let first_with = |k: &[u8]| keys.iter().position(|x| x == k);
    let leaders: Vec<usize> =
        (0..keys.len()).filter(|&r| !keys[r].is_empty() && first_with(&keys[r]) == Some(r)).collect();
    if leaders.is_empty() {
        return Ok((cfg.policy, Vec::new()));
    }
    let me = comm.rank() as usize;
    let mut mine = None;
    for &leader in &leaders {
        if leader == me {
            mine = Some(choose(comm, cfg));
        }
        comm.barrier()?;
    }
    let results = comm.exchange(&encode(mine.as_ref()))?;
    match first_with(&keys[me]) {
        Some(leader) if !key.is_empty() => decode(&results[leader], leader),
        _ => Ok((cfg.policy, Vec::new())),
    }
}

/// A leader's outcome: 0, the chosen index, then (index, rate) per category; or 1 and a text.
fn encode(r: Option<&Result<Choice>>) -> Vec<u8> {
    let index =
        |p: EndpointPolicy| EndpointPolicy::CATEGORIES.iter().position(|&c| c == p).unwrap_or(0) as u8;
    match r {
        None => vec![],
        Some(Ok((p, measured))) => {
            let mut b = vec![0, index(*p)];
            for &(c, rate) in measured {
                b.push(index(c));
                b.extend_from_slice(&rate.to_le_bytes());
            }
            b
        }
        Some(Err(e)) => [&[1u8][..], e.to_string().as_bytes()].concat(),
    }
}

fn decode(b: &[u8], leader: usize) -> Result<Choice> {
    let category = |i: u8| EndpointPolicy::CATEGORIES.get(i as usize).copied();
    let bad = || crate::Error::Remote(format!("rank {leader}'s endpoint calibration: malformed result"));
    match b {
        [0, chosen, rest @ ..] if rest.len() % 9 == 0 => {
            let measured = rest
                .chunks_exact(9)
                .map(|c| {
                    Ok((
                        category(c[0]).ok_or_else(bad)?,
                        f64::from_le_bytes(c[1..9].try_into().map_err(|_| bad())?),
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((category(*chosen).ok_or_else(bad)?, measured))
        }
        [1, why @ ..] => Err(crate::Error::Remote(format!(
            "rank {leader}'s endpoint calibration failed: {}",
            String::from_utf8_lossy(why)
        ))),
        _ => Err(bad()),
    }
}

/// Measures every category on this rank and picks (see the module documentation).
fn choose(comm: &Comm, cfg: &EndpointConfig) -> Result<(EndpointPolicy, Vec<(EndpointPolicy, f64)>)> {
    if !comm.native_rma {
        return Ok((EndpointPolicy::Dynamic, Vec::new()));
    }
    let region = comm.fabric.register(cfg.threads * 128)?;
    let target = comm.fabric.attach(comm.rank(), &region.desc)?;
    comm.fabric.seal(&region)?;
    // The 8 B puts it measures are inline, as in the paper's runs.
    let knobs = Knobs { inline_max: cfg.inline_max.max(8), ..cfg.knobs() };
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
                    let off = ep.index() * 128;
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
