//! Distributed arrays and aggregation (issue 54): every operation against a serial model, the
//! flush rules, the delay bound and a peer that dies with operations buffered for it.

use crate::common::{ck, Res};
use std::time::{Duration, Instant};
use weft::{AtomicArray, Distribution, Error, World};

/// A deterministic stream of indices below `len` for a seed (the same on every rank).
fn picks(seed: u64, count: usize, len: usize) -> impl Iterator<Item = usize> + Clone {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count).map(move |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % len as u64) as usize
    })
}

fn dists() -> [Distribution; 3] {
    [Distribution::Block, Distribution::Cyclic, Distribution::BlockCyclic(7)]
}

/// Every element and batch operation, each distribution, checked against what a serial
/// program computes; ordering of one rank's operations on one element; indices out of range.
pub(crate) fn array_ops() -> Res {
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    for dist in dists() {
        let len = 1000 + 3 * n as usize;
        // Histogram: every rank adds 1 at 20 000 indices of its own stream.
        let h = AtomicArray::<u64>::with_distribution(&w, len, dist)?;
        h.batch_add(picks(me as u64 + 1, 20_000, len), 1)?.wait()?;
        w.barrier()?;
        let mut want = vec![0u64; len];
        for r in 0..n {
            for i in picks(r as u64 + 1, 20_000, len) {
                want[i] += 1;
            }
        }
        let got = h.to_vec()?;
        ck(got == want, || format!("{dist:?}: histogram differs from the serial one"))?;
        ck(h.sum()? == 20_000 * n as u64, || format!("{dist:?}: sum"))?;

        // Gather: element i holds 3i + 1 (each rank writes its part), then random loads.
        let g = AtomicArray::<i64>::with_distribution(&w, len, dist)?;
        for off in 0..g.local_len() {
            let i = g.global_index(off);
            g.store(i, 3 * i as i64 + 1)?;
        }
        w.barrier()?;
        let idx: Vec<usize> = picks(100 + me as u64, 5000, len).collect();
        let vals = g.batch_load(idx.iter().copied())?.wait()?;
        ck(vals.len() == idx.len(), || "gather length".into())?;
        for (k, (&i, &v)) in idx.iter().zip(&vals).enumerate() {
            ck(v == 3 * i as i64 + 1, || format!("{dist:?}: gather item {k}: index {i} gave {v}"))?;
        }
        ck(g.min()? == Some(1) && g.max()? == Some(3 * (len as i64 - 1) + 1), || {
            format!("{dist:?}: min/max")
        })?;

        // Fetch-add: one rank's three adds to one element are applied in order.
        let f = AtomicArray::<u64>::with_distribution(&w, len, dist)?;
        let mine = len - 1 - me as usize;
        let olds = f.batch_fetch_add([mine, mine, mine, 0], 1)?.wait()?;
        ck(olds[..3] == [0, 1, 2], || format!("{dist:?}: fetch-adds out of order: {olds:?}"))?;
        w.barrier()?;
        ck(f.load(0)? == n as u64, || format!("{dist:?}: element 0 got {} adds", f.load(0).unwrap_or(0)))?;

        // Scatter: rank r writes r + 10 at the indices ≡ r (mod n).
        let s = AtomicArray::<u64>::with_distribution(&w, len, dist)?;
        s.batch_store((me as usize..len).step_by(n as usize), me as u64 + 10)?.wait()?;
        w.barrier()?;
        let all = s.to_vec()?;
        for (i, &v) in all.iter().enumerate() {
            ck(v == (i % n as usize) as u64 + 10, || format!("{dist:?}: scatter: element {i} = {v}"))?;
        }
        // Out of range: the whole batch fails before anything leaves.
        let r = s.batch_add([1, len, 2], 5);
        ck(
            matches!(r, Err(Error::IndexOutOfRange { index, position: Some(1), len: l }) if index == len && l == len),
            || format!("{dist:?}: out-of-range batch gave {r:?}"),
        )?;
        // An iterator whose clone does not repeat it (shared state): an error, never a panic
        // or a write past the array.
        let walks = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let shifty = (0..4usize).map(move |k| {
            walks.set(walks.get() + 1);
            if walks.get() <= 4 {
                k
            } else {
                len + k
            }
        });
        let r = s.batch_load(shifty.clone());
        ck(matches!(r, Err(Error::IndexOutOfRange { .. })), || {
            format!("{dist:?}: shifty gather gave {r:?}")
        })?;
        let r = s.batch_add(shifty, 1);
        ck(matches!(r, Err(Error::IndexOutOfRange { .. })), || format!("{dist:?}: shifty add gave {r:?}"))?;
        let r = s.load(len + 4);
        ck(matches!(r, Err(Error::IndexOutOfRange { position: None, .. })), || {
            format!("{dist:?}: load past the end: {r:?}")
        })?;
        w.barrier()?;
        ck(s.load(1)? == 1 % n as u64 + 10 && s.load(2)? == 2 % n as u64 + 10, || {
            format!("{dist:?}: a refused batch changed elements")
        })?;
        w.barrier()?;
    }
    // Element operations on another rank's element.
    let e = AtomicArray::<u64>::new(&w, 4 * n as usize)?;
    let theirs = 4 * ((me + 1) % n) as usize; // rank me+1's first element
    w.barrier()?;
    if me == 0 {
        let c0 = e.compare_exchange(theirs, 0, 0b1100)?;
        ck(c0 == 0, || format!("compare_exchange gave {c0} at {theirs}: {:?}", e.to_vec()))?;
        ck(e.compare_exchange(theirs, 0, 1)? == 0b1100, || "failed compare_exchange".into())?;
        ck(e.fetch_and(theirs, 0b0100)? == 0b1100, || "fetch_and".into())?;
        ck(e.fetch_or(theirs, 0b0011)? == 0b0100, || "fetch_or".into())?;
        ck(e.fetch_xor(theirs, 0b0001)? == 0b0111, || "fetch_xor".into())?;
        ck(e.swap(theirs, 42)? == 0b0110, || "swap".into())?;
        ck(e.load(theirs)? == 42, || "load".into())?;
    }
    w.barrier()?;
    e.fill(9)?;
    ck(e.sum()? == 9 * 4 * n as u64, || "fill/sum".into())?;
    w.barrier()?;
    Ok(())
}

/// Items buffered for a long time (`WEFT_AGG_DELAY_US` = 60 s) leave when their rank waits in
/// a barrier: rank 0 adds to rank 1's elements and enters a barrier without waiting on the
/// handle; rank 1 then sees them.
pub(crate) fn array_flush_on_wait() -> Res {
    let w = World::init()?;
    let a = AtomicArray::<u64>::new(&w, 2 * w.size() as usize)?;
    if w.rank() == 0 {
        let handle = a.batch_add([2, 3, 3], 1)?;
        w.barrier()?;
        handle.wait()?;
    } else {
        w.barrier()?;
    }
    if w.rank() == 1 {
        let deadline = Instant::now() + Duration::from_secs(30);
        w.wait_until(|| {
            (a.load(2).ok() == Some(1) && a.load(3).ok() == Some(2)) || Instant::now() > deadline
        })?;
        ck(a.load(2)? == 1 && a.load(3)? == 2, || "buffered adds not delivered after the barrier".into())?;
    }
    w.barrier()?;
    Ok(())
}

/// A rank that adds once and then computes for 1 s (no weft call): the helper thread sends the
/// add within the delay bound. The add carries its time of sending; rank 1 measures when it
/// arrived (one host: one monotonic clock).
pub(crate) fn array_delay_bound() -> Res {
    let w = World::init()?;
    let a = AtomicArray::<u64>::new(&w, 2 * w.size() as usize)?;
    w.barrier()?;
    if w.rank() == 0 {
        let sent = weft::fabric::os::now_ns();
        let handle = a.batch_add([2], sent)?;
        let t = Instant::now();
        let mut x = 1u64;
        while t.elapsed() < Duration::from_secs(1) {
            x = std::hint::black_box(x.wrapping_mul(3).wrapping_add(1));
        }
        handle.wait()?;
    } else if w.rank() == 1 {
        let mut arrived = 0;
        w.wait_until(|| {
            let v = a.load(2).unwrap_or(0);
            if v != 0 && arrived == 0 {
                arrived = weft::fabric::os::now_ns();
            }
            v != 0
        })?;
        let sent = a.load(2)?;
        let took = Duration::from_nanos(arrived.saturating_sub(sent));
        println!("delay bound: an add sent by a computing rank arrived after {took:?}");
        // The bound is 100 µs; a loaded machine adds scheduling delays, never the 1 s of compute.
        ck(took < Duration::from_millis(250), || format!("the add arrived after {took:?}"))?;
    }
    w.barrier()?;
    Ok(())
}

/// A peer that dies with operations buffered for it: the handle fails with `PeerFailed`
/// naming it. A second thread of rank 0 buffers adds for rank 1 (`WEFT_AGG_DELAY_US` = 60 s
/// keeps them there); rank 1 exits without finalizing; once a barrier has failed on rank 1's
/// death, the thread waits on its handle.
pub(crate) fn array_peer_dies() -> Res {
    let w = World::init()?;
    let a = AtomicArray::<u64>::new(&w, 2 * w.size() as usize)?;
    w.barrier()?;
    if w.rank() == 1 {
        std::process::exit(0);
    }
    let (buffered_tx, buffered) = std::sync::mpsc::channel();
    let (dead, dead_rx) = std::sync::mpsc::channel::<()>();
    let me = w.rank();
    std::thread::scope(|s| {
        let a = &a;
        let t = s.spawn(move || {
            let h = if me == 0 { Some(a.batch_add([2, 3, 0], 1)) } else { None };
            let _ = buffered_tx.send(());
            let _ = dead_rx.recv();
            h.map(|h| h.and_then(|h| h.wait()))
        });
        let _ = buffered.recv();
        let r = w.barrier();
        let _ = dead.send(());
        // Rank 1 gone (or another rank that saw it and left first).
        ck(matches!(r, Err(Error::PeerFailed { .. })), || format!("barrier after rank 1 left: {r:?}"))?;
        let r = t.join().map_err(|_| "the batch thread panicked")?;
        match r {
            None => Ok(()),
            Some(r) => ck(matches!(r, Err(Error::PeerFailed { rank: 1, .. })), || {
                format!("adds buffered for a dead rank gave {r:?}")
            }),
        }
    })
}

/// A batch that reaches a rank where its array was dropped fails, naming that rank; its
/// operations are not applied elsewhere.
pub(crate) fn array_dropped_on_owner() -> Res {
    let w = World::init()?;
    let a = AtomicArray::<u64>::new(&w, 4 * w.size() as usize)?;
    let a = if w.rank() == 1 {
        drop(a);
        None
    } else {
        Some(a)
    };
    w.barrier()?;
    if let (0, Some(a)) = (w.rank(), &a) {
        let r = a.batch_add([4, 5], 1).and_then(|h| h.wait());
        ck(matches!(&r, Err(Error::Remote(m)) if m.contains("rank 1 does not hold the array")), || {
            format!("adds to a rank that dropped the array gave {r:?}")
        })?;
        let r = a.batch_fetch_add([6], 1).and_then(|h| h.wait());
        ck(matches!(&r, Err(Error::Remote(_))), || format!("fetch-adds there gave {r:?}"))?;
    }
    w.barrier()?;
    Ok(())
}

/// A user's index iterator that panics half-way through a batch (caught): the items it had
/// buffered still leave within the delay bound, from the helper thread, while rank 0 makes no
/// weft call until rank 1 has checked and raised a flag in rank 0's memory (the panic had left
/// the buffers' lock poisoned, and the helper skipped it for ever).
pub(crate) fn array_panicking_iterator() -> Res {
    let w = World::init()?;
    let a = AtomicArray::<u64>::new(&w, 4 * w.size() as usize)?;
    let checked = w.alloc_segment::<u64>(1)?;
    w.barrier()?;
    if w.rank() == 0 {
        let walks = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let panics = (4..8usize).inspect(move |_| {
            walks.set(walks.get() + 1);
            // The checking walk yields 4 items; the sending one panics at its third.
            assert!(walks.get() != 7, "the user's iterator panics");
        });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.batch_add(panics, 1)));
        ck(r.is_err(), || "the iterator did not panic".into())?;
        // No weft call (no flush) until rank 1 says it has looked.
        let flag = checked.local();
        while flag.atomic(0).load(std::sync::atomic::Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
    } else if w.rank() == 1 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let arrived = || a.load(4).ok() == Some(1) && a.load(5).ok() == Some(1);
        w.wait_until(|| arrived() || Instant::now() > deadline)?;
        let got = arrived();
        w.put(checked.at(0, 0), &[1])?;
        ck(got, || "items buffered before a panic never left".into())?;
    }
    w.barrier()?;
    Ok(())
}

/// A child of `fork` that calls weft gets an error at once (it would take its parent's
/// messages: a batch waited on in a child hung the whole job), and the job goes on.
pub(crate) fn array_fork_child() -> Res {
    let w = World::init()?;
    let a = AtomicArray::<u64>::new(&w, 4 * w.size() as usize)?;
    w.barrier()?;
    if w.rank() == 0 {
        // SAFETY: the child only calls weft (which must refuse at once) and `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let add = a.batch_add([4, 5], 1);
            let barrier = w.barrier();
            let refused =
                |r: &Result<(), Error>| matches!(r, Err(Error::Misuse(m)) if m.contains("child of fork"));
            let ok = add.is_err() && matches!(add, Err(Error::Misuse(_))) && refused(&barrier);
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        ck(waited == pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, || {
            format!("the fork child's weft calls were not refused (status {status:#x})")
        })?;
        a.batch_add([4, 5], 1)?.wait()?;
    }
    w.barrier()?;
    ck(a.sum()? == 2, || "the parent's batch after the child".into())?;
    Ok(())
}
