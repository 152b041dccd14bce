//! The progress threads: the one that polls whenever no program thread waits
//! ([`crate::Progress::Always`]) and the on-demand one ([`crate::Progress::OnDemand`]), with
//! what program threads tell them (`touch`, `want_progress`) and the liveness checks they run
//! for awaited futures.

use crate::progress::{Backoff, Deps};
use crate::{Comm, Error};
use std::sync::atomic::Ordering;
use std::task::Context;
use std::time::{Duration, Instant};
use weft_fabric::PollSet;

/// How long the progress thread stands aside before it looks again whether an application
/// thread still waits (and so makes progress itself).
const STAND_ASIDE: Duration = Duration::from_micros(500);

impl Comm {
    pub(crate) fn progress_loop(&self) {
        let mut backoff = Backoff::new(self);
        while !self.stop.load(Ordering::Acquire) {
            if self.waiting.load(Ordering::Acquire) > 0 {
                // Stand aside: on few cores a second poller only takes the core (and the
                // completion queue) from the thread that waits for the next message.
                std::thread::park_timeout(STAND_ASIDE);
                backoff.reset();
                continue;
            }
            let hooks = self.run_hooks().unwrap_or_else(|e| {
                self.record_error(e);
                0
            });
            match self.fabric.progress(self, PollSet::All).map(|n| n + hooks) {
                Ok(0) => {
                    // A process started as this rank too: said at this rank's next call.
                    if backoff.snooze(self) {
                        if let Err(e) = self.fabric.check_claim() {
                            self.record_error(e.into());
                        }
                        self.fail_awaited();
                    }
                }
                Ok(_) => backoff.reset(),
                Err(e) => {
                    self.record_error(e.into());
                    return;
                }
            }
        }
    }
}

thread_local! {
    /// Set on the progress thread.
    static IS_PROGRESS_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// How long the on-demand progress thread sleeps at most on the doorbell, or between two
/// looks, while no application thread polls.
const TICK: Duration = Duration::from_millis(1);
/// How long the on-demand thread parks while application threads poll: a watch without a
/// poll makes it serve.
const WATCH: Duration = Duration::from_millis(4);
/// With [`crate::Progress::Off`], pending polls of futures between two liveness checks.
const OFF_CHECK_POLLS: u32 = 4096;
/// Rounds after a future last went pending, or a round delivered something, during which the
/// on-demand thread sleeps on the doorbell (answering at once) rather than looking every tick.
const AWAITED_TICKS: u32 = 5;

impl Comm {
    /// Says that an application thread makes progress in weft (the on-demand progress thread
    /// parks). Only polling paths call it: a thread that sends between spells of computing
    /// delivers nothing. One load while the flag is already set.
    #[inline(always)]
    pub(crate) fn touch(&self) {
        if !self.active.load(Ordering::Relaxed) {
            self.touch_slow();
        }
    }

    /// The rare part of [`Comm::touch`]: the progress thread's own calls (replies, results)
    /// do not count.
    #[cold]
    fn touch_slow(&self) {
        if !IS_PROGRESS_THREAD.with(|p| p.get()) {
            self.active.store(true, Ordering::Relaxed);
        }
    }

    /// What a weft future does on returning `Pending`: make sure something will make progress
    /// and wake it (see [`crate::Progress`]).
    pub(crate) fn future_pending(&self, cx: &Context<'_>) {
        match self.cfg.progress {
            crate::Progress::Off => {
                // No thread checks the peers of awaited futures: their own polls do, now and
                // then (they poll again at once, so this is a spin).
                if self.off_polls.fetch_add(1, Ordering::Relaxed).is_multiple_of(OFF_CHECK_POLLS) {
                    self.fail_awaited();
                }
                cx.waker().wake_by_ref()
            }
            crate::Progress::OnDemand => self.want_progress(),
            crate::Progress::Always => {}
        }
    }

    /// Fails the operations and calls that futures await from ranks that died or left the
    /// job (once everything they sent is handled) and wakes those futures: nothing else
    /// would, as no answer will come. Runs at liveness checks (every `peer_check`).
    pub(crate) fn fail_awaited(&self) {
        // Not again from inside itself (a check that waits runs the liveness checks).
        thread_local! { static CHECKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) }; }
        if CHECKING.with(|c| c.replace(true)) {
            return;
        }
        struct Done;
        impl Drop for Done {
            fn drop(&mut self) {
                CHECKING.with(|c| c.set(false));
            }
        }
        let _done = Done;
        self.wake_failed_teams();
        if self.ops.in_flight() == 0 && self.ext.liveness.is_empty() {
            return;
        }
        let verdicts = std::cell::RefCell::new(Vec::<(u32, Option<Error>)>::new());
        let gone = |r: u32| {
            if let Some((_, v)) = verdicts.borrow().iter().find(|(q, _)| *q == r) {
                return v.clone();
            }
            let v = if r == self.rank() { None } else { self.failed_peer(Deps::Rank(r)) };
            verdicts.borrow_mut().push((r, v.clone()));
            v
        };
        self.ops.fail_gone(&gone);
        for h in &self.ext.liveness {
            h(self, &gone);
        }
    }

    /// Ends every awaited operation, call and collective with `e` and wakes their futures
    /// (the World was dropped: nothing will progress them any more).
    pub(crate) fn fail_all_awaited(&self, e: Error) {
        let gone = |_: u32| Some(e.clone());
        self.ops.fail_gone(&gone);
        for h in &self.ext.liveness {
            h(self, &gone);
        }
        self.wake_awaited_teams();
    }

    /// Asks the on-demand progress thread to serve now (a future went pending, or a layer's
    /// hook has work: a woken task). Costs a wake-up call only when the request is new.
    pub(crate) fn want_progress(&self) {
        if self.cfg.progress == crate::Progress::OnDemand && !self.wanted.swap(true, Ordering::AcqRel) {
            if let Some(t) = self.helper.get() {
                t.unpark();
            }
        }
    }

    /// The [`crate::Progress::OnDemand`] thread: parks for a [`WATCH`] at a time while
    /// application threads poll or wait in weft (they make progress). Once a watch passed without one,
    /// it looks for arrived traffic every [`TICK`] and serves it, on loan of the program's
    /// single-thread fast path ([`weft_fabric::Fabric::borrow_fast_path`]). While a future
    /// waits (it went pending since the last look), or traffic flows, it serves at once and
    /// sleeps on the doorbell, which arriving traffic rings: a sleeper there costs every
    /// sender a wake-up call, which only a waiting future or a stream being served is worth.
    pub(crate) fn on_demand_loop(&self) {
        IS_PROGRESS_THREAD.with(|p| p.set(true));
        let mut next_check = Instant::now() + self.cfg.peer_check;
        let (mut woken, mut awaited) = (false, 0u32);
        while !self.stop.load(Ordering::Acquire) {
            let wanted = self.wanted.swap(false, Ordering::AcqRel);
            // Awaited collectives move on puts, which need not ring the doorbell: drive them
            // at least every tick while any is awaited.
            let teams = self.any_awaited_team.load(Ordering::Acquire);
            // Futures count as waiting for a few rounds after one last went pending (so does
            // traffic after a round that delivered some).
            awaited = if wanted || teams { AWAITED_TICKS } else { awaited.saturating_sub(1) };
            if Instant::now() >= next_check {
                next_check = Instant::now() + self.cfg.peer_check;
                if let Err(e) = self.fabric.check_claim() {
                    self.record_error(e.into());
                }
                self.fail_awaited();
            }
            let active =
                self.active.swap(false, Ordering::Relaxed) || self.waiting.load(Ordering::Acquire) > 0;
            if !wanted && active {
                // The program is in weft: look again after a watch (each look is a wake-up
                // that takes a core from a busy rank for a moment).
                std::thread::park_timeout(WATCH);
                woken = false;
                continue;
            }
            if !wanted && !woken && !self.fabric.has_incoming() {
                // Nothing arrived. Sleep on the doorbell only while futures wait on this world
                // (a sleeper there costs every sender a wake-up call); otherwise look again
                // after a tick, without sleeping (a fabric whose traffic only a poll of its
                // queue shows answers this look for real).
                if awaited > 0 {
                    woken = self.fabric.wait_incoming(TICK, &mut || false);
                } else {
                    std::thread::park_timeout(TICK);
                    woken = self.fabric.wait_incoming(Duration::ZERO, &mut || false);
                }
                if !teams {
                    continue;
                }
            }
            let lent = self.fabric.borrow_fast_path();
            let polled = self.fabric.progress(self, PollSet::All);
            // After delivery: what the handlers queued (calls to run, chunks to pull) goes on
            // in this same round.
            let hooks = self.run_hooks().unwrap_or_else(|e| {
                self.record_error(e);
                0
            });
            if lent {
                self.fabric.return_fast_path();
            }
            let delivered = match polled {
                Ok(n) => n,
                Err(e) => {
                    self.record_error(e.into());
                    return;
                }
            };
            if delivered > 0 {
                // Traffic flows: answer the next message at once too.
                awaited = AWAITED_TICKS;
            }
            // Another round at once while anything happened (a handler or a hook may have
            // left work for the next one); sleep when a round found nothing.
            woken = delivered + hooks > 0;
        }
    }
}
