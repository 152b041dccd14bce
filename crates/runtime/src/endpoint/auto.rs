//! [`EndpointPolicy::Auto`]: measure every category on this rank and take the cheapest one
//! within the tolerance of the fastest.
//!
//! The measurement is local: `threads` threads post 8-byte inline puts through each
//! category's queues, locks and completion structures into a region of this rank, for 8 ms at
//! a time, in five rounds over all categories (the best of each counts); a cheaper category
//! that missed the tolerance by a little is measured again, in turns with the fastest, before
//! it is ruled out. Ranks that ask for the
//! same configuration share one measurement, taken by the first of them, and measurements
//! run one at a time: ranks calibrating at once would share the cores and measure each other.
//! Without native RMA there is nothing local to measure and Auto takes `Dynamic`. Where the
//! fabric's slots carry puts (libfabric), each trial opens the category's slots on this rank
//! alone and measures through them; their cost is what the fabric allocated for them.

use super::ep::Slot;
use super::queue::Knobs;
use super::set::{build, queue_bytes, EndpointResources};
use super::{EndpointConfig, EndpointPolicy, Layout};
use crate::{Comm, Result};
use std::time::{Duration, Instant};
use weft_fabric::LocalRegion;

/// How long each trial posts.
const TRIAL: Duration = Duration::from_millis(8);
const TRIALS: usize = 5;
/// A category this far behind the fastest (and cheaper) is measured again before it is ruled
/// out, in [`CONFIRM_TRIALS`] more turns with the fastest.
const CONFIRM_WITHIN: f64 = 0.35;
const CONFIRM_TRIALS: usize = 3;

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
    let cpus = weft_fabric::os::allowed_cpus();
    // Rounds over all categories, best of each: noise (other processes, the other ranks
    // calibrating at the same time) then hits every category alike.
    let mut measured: Vec<(EndpointPolicy, f64)> =
        EndpointPolicy::CATEGORIES.iter().map(|&p| (p, 0.0)).collect();
    let mut slot_bytes: Vec<(EndpointPolicy, u64)> = Vec::new();
    // One trial of `policy`; its rate raises the category's best.
    let measure = |measured: &mut [(EndpointPolicy, f64)],
                   slot_bytes: &mut Vec<(EndpointPolicy, u64)>,
                   policy: EndpointPolicy|
     -> Result<()> {
        let layout = Layout::new(policy, cfg.threads, cfg.cq, cfg.static_slots);
        let (slots, inboxes) = local_slots(comm, &layout, cfg);
        if !inboxes.is_empty() && !slot_bytes.iter().any(|(q, _)| *q == policy) {
            let bytes = slots.iter().flatten().flatten().map(|s| s.resources().bytes).sum();
            slot_bytes.push((policy, bytes));
        }
        let rate = trial(comm, &layout, knobs, &target, slots, &cpus);
        for r in &inboxes {
            let _ = comm.fabric.close_slot_inbox(r);
        }
        if let Some(m) = measured.iter_mut().find(|m| m.0 == policy) {
            m.1 = m.1.max(rate?);
        }
        Ok(())
    };
    let cost_of = |slot_bytes: &[(EndpointPolicy, u64)], p: EndpointPolicy| {
        let layout = Layout::new(p, cfg.threads, cfg.cq, cfg.static_slots);
        match slot_bytes.iter().find(|(q, _)| *q == p) {
            // What the fabric allocated for the slots it opened (a network).
            Some(&(_, bytes)) => layout.software_bytes(queue_bytes(cfg)) + bytes,
            None => EndpointResources::new(layout, comm.size() as usize, cfg).bytes,
        }
    };
    let mut run = || -> Result<EndpointPolicy> {
        for _ in 0..TRIALS {
            for p in EndpointPolicy::CATEGORIES {
                measure(&mut measured, &mut slot_bytes, p)?;
            }
        }
        let mut by_cost: Vec<EndpointPolicy> = EndpointPolicy::CATEGORIES.to_vec();
        by_cost.sort_by_key(|&p| cost_of(&slot_bytes, p));
        pick(&by_cost, &mut measured, cfg.tolerance, |m, p| measure(m, &mut slot_bytes, p))
    };
    let r = run();
    comm.fabric.deregister(&region);
    let chosen = r?;
    Ok((chosen, measured))
}

/// The fastest category measured and its rate.
fn fastest(measured: &[(EndpointPolicy, f64)]) -> (EndpointPolicy, f64) {
    measured.iter().copied().fold((EndpointPolicy::Dynamic, 0.0), |a, m| if m.1 > a.1 { m } else { a })
}

/// The first of `by_cost` (cheapest first) whose best rate in `measured` is within `tolerance`
/// of the fastest's. One that missed by less than [`CONFIRM_WITHIN`] first gets
/// [`CONFIRM_TRIALS`] more trials in turns with the fastest (`again` runs one trial of a
/// category and raises its best in `measured`): a spell of noise over one category's five
/// trials had put shared-dynamic 7-30% behind categories it matches on shared memory (every
/// category but Shared posts puts the same way there), and Auto then took one that costs
/// twice as much.
fn pick(
    by_cost: &[EndpointPolicy],
    measured: &mut [(EndpointPolicy, f64)],
    tolerance: f64,
    mut again: impl FnMut(&mut [(EndpointPolicy, f64)], EndpointPolicy) -> Result<()>,
) -> Result<EndpointPolicy> {
    let rate_of = |m: &[(EndpointPolicy, f64)], p| m.iter().find(|x| x.0 == p).map_or(0.0, |x| x.1);
    for &p in by_cost {
        let (best, rate) = fastest(measured);
        let mine = rate_of(measured, p);
        if mine >= rate * (1.0 - tolerance) {
            return Ok(p);
        }
        if mine >= rate * (1.0 - CONFIRM_WITHIN) {
            for _ in 0..CONFIRM_TRIALS {
                again(measured, p)?;
                again(measured, best)?;
            }
            if rate_of(measured, p) >= fastest(measured).1 * (1.0 - tolerance) {
                return Ok(p);
            }
        }
    }
    Ok(fastest(measured).0)
}

/// The transmit slots of `layout`, opened on this rank alone, where the fabric's slots carry
/// the puts being measured (a network: receives land on every rank's main endpoint, so slots
/// opened by one rank reach everyone). On shared memory puts need no slot: none are opened.
/// Returns the slots (`None` each where not opened) and the contexts to close afterwards.
fn local_slots(comm: &Comm, layout: &Layout, cfg: &EndpointConfig) -> (Vec<Vec<Slot>>, Vec<LocalRegion>) {
    let none = || layout.slots_per_context.iter().map(|&s| (0..s).map(|_| None).collect()).collect();
    if comm.caps.load_store {
        return (none(), Vec::new());
    }
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let mut inboxes = Vec::new();
    let mut slots = Vec::new();
    for &count in &layout.slots_per_context {
        let mut per = vec![0u32; n];
        per[me] = count as u32;
        let opened = comm.fabric.open_slot_inbox(&per, cfg.ring_kib * 1024).and_then(|r| {
            let mut descs = vec![Vec::new(); n];
            descs[me] = r.desc.clone();
            inboxes.push(r);
            comm.fabric.open_tx_slots(&descs, &per, 0, count as u32)
        });
        match opened {
            Ok(s) => slots.push(s.into_iter().map(Some).collect()),
            Err(_) => {
                drop(slots);
                for r in &inboxes {
                    let _ = comm.fabric.close_slot_inbox(r);
                }
                return (none(), Vec::new());
            }
        }
    }
    (slots, inboxes)
}

/// Operations per second of `layout`'s endpoints over `slots`, all posting at once.
fn trial(
    comm: &Comm,
    layout: &Layout,
    knobs: Knobs,
    target: &weft_fabric::RemoteRegion,
    slots: Vec<Vec<Slot>>,
    cpus: &[usize],
) -> Result<f64> {
    let endpoints = build(comm, layout, knobs, slots);
    // Every endpoint here is private to this function: nothing to close.
    let start = Instant::now();
    let counts = std::thread::scope(|s| {
        let workers: Vec<_> = endpoints
            .into_iter()
            .map(|mut ep| {
                s.spawn(move || -> Result<u64> {
                    // Bound to a CPU each (these threads end with the trial): unbound, the
                    // scheduler sometimes kept two on one core for part of a trial, and
                    // categories that cost the same measured more than 5% apart.
                    weft_fabric::os::pin_to_nth(cpus, ep.index());
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
                    ep.sync_nbi()?;
                    Ok(n)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or(Ok(0))).collect::<Result<Vec<u64>>>()
    })?;
    Ok(counts.iter().sum::<u64>() as f64 / start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use EndpointPolicy::{Dedicated, Shared, SharedDynamic};

    #[test]
    fn a_near_miss_is_measured_again_and_a_far_one_is_not() {
        let by_cost = [Shared, SharedDynamic, Dedicated];
        // Shared-dynamic 12% behind: measured again in turns with the fastest; it catches up.
        let mut m = vec![(Shared, 30.0), (SharedDynamic, 140.0), (Dedicated, 160.0)];
        let mut calls = vec![];
        let chosen = pick(&by_cost, &mut m, 0.05, |m: &mut [(EndpointPolicy, f64)], p| {
            calls.push(p);
            if p == SharedDynamic {
                m[1].1 = 158.0;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(chosen, SharedDynamic);
        assert!(!calls.contains(&Shared), "Shared is far behind: no more trials");
        assert_eq!(calls.len(), 2 * CONFIRM_TRIALS);
        // It stays behind: the fastest is taken.
        let mut m = vec![(Shared, 30.0), (SharedDynamic, 140.0), (Dedicated, 160.0)];
        assert_eq!(
            pick(&by_cost, &mut m, 0.05, |_: &mut [(EndpointPolicy, f64)], _| Ok(())).unwrap(),
            Dedicated
        );
        // Within the tolerance from the start: no trials at all.
        let mut m = vec![(Shared, 30.0), (SharedDynamic, 155.0), (Dedicated, 160.0)];
        let chosen =
            pick(&by_cost, &mut m, 0.05, |_: &mut [(EndpointPolicy, f64)], _| panic!("no trial needed"));
        assert_eq!(chosen.unwrap(), SharedDynamic);
    }
}
