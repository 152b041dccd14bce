//! The remote functions that are waiting (`async` ones that returned `Pending`), and their
//! wake-ups.
//!
//! Each task holds a slot of a table for its whole life (its id: index and generation, see
//! [`CallTable`]) and a [`Flag`]. Its waker sets the flag's `woken`; on the change from clear to
//! set it lists the task's id as ready, then sets the queue's `any`. The progress hook looks at
//! `any` (one load when nothing happened), clears it, takes the listed ids and, for each, the
//! task in its slot if its flag is set, clearing the flag before the task is polled: the work
//! grows with the tasks woken, not with the tasks waiting. An id whose task was taken already,
//! is out of its slot being polled, or finished (a stale generation) takes nothing.
//!
//! The rule that keeps a wake-up from being lost: **a task that is put back with its flag set
//! is listed again** ([`TaskQueue::park`]). A waker may fire while its task is out of its slot
//! being polled; a hook that took its id then found no task and left the flag set, and a flag
//! that stays set lists nothing on the next wake-up: the task would sleep for ever.
//!
//! Every access is `SeqCst` and the lists are under mutexes, so the queue behaves as some
//! interleaving of its steps (`claim`, `collect`, `take`, `put`, `rearm`, and the waker's
//! `mark`, `list` and `signal`); the tests run every interleaving of a waker against two
//! progress threads through those same steps.

use crate::calls::CallTable;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What wakers tell the queue.
struct Ready {
    /// Some task was listed since the last claim.
    any: AtomicBool,
    /// The ids listed since the last collect.
    ids: Mutex<Vec<u64>>,
}

/// A task's wake-up flag (share it with the task's waker).
pub(crate) struct Flag {
    woken: AtomicBool,
    /// The task's slot.
    id: u64,
    ready: Arc<Ready>,
}

impl Flag {
    /// Marks the task ready; if it was not, lists it and tells the queue.
    pub(crate) fn wake(&self) {
        if self.mark() {
            self.list();
            self.signal();
        }
    }
    /// Sets the flag: true if it was clear.
    fn mark(&self) -> bool {
        !self.woken.swap(true, SeqCst)
    }
    fn list(&self) {
        lock(&self.ready.ids).push(self.id);
    }
    fn signal(&self) {
        self.ready.any.store(true, SeqCst);
    }
}

/// A task in its slot, with its flag (`None` while it is out being polled).
type Slot<T> = Option<(Arc<Flag>, T)>;

/// Tasks waiting for their wakers.
pub(crate) struct TaskQueue<T> {
    slots: Mutex<CallTable<Slot<T>>>,
    ready: Arc<Ready>,
}

impl<T> TaskQueue<T> {
    pub(crate) fn new() -> Self {
        let ready = Ready { any: AtomicBool::new(false), ids: Mutex::new(Vec::new()) };
        TaskQueue { slots: Mutex::new(CallTable::default()), ready: Arc::new(ready) }
    }

    /// A slot for a new task, and its flag, clear: the caller polls the task at once, then
    /// parks it or closes the slot.
    pub(crate) fn flag(&self) -> Arc<Flag> {
        let id = lock(&self.slots).insert(None);
        Arc::new(Flag { woken: AtomicBool::new(false), id, ready: self.ready.clone() })
    }

    /// Takes the tasks woken since the last call, clearing each flag before it is handed out
    /// (a wake-up during the poll that follows sets it again). One load when none was woken.
    pub(crate) fn take_ready(&self) -> Vec<(Arc<Flag>, T)> {
        if !self.claim() {
            return Vec::new();
        }
        let ids = self.collect();
        self.take(&ids)
    }

    /// Puts a task back into its slot after a poll returned `Pending` (its flag was cleared
    /// before that poll).
    pub(crate) fn park(&self, flag: Arc<Flag>, task: T) {
        self.put(flag.clone(), task);
        self.rearm(&flag);
    }

    /// Frees the slot of a task that finished: a later wake-up of its flag takes nothing.
    pub(crate) fn close(&self, flag: &Flag) {
        lock(&self.slots).remove(flag.id);
    }

    /// Step 1 of [`TaskQueue::take_ready`]: true if some task was listed since the last claim
    /// (loaded first: every waiting thread polls here, and a swap on every poll would bounce
    /// the line between them).
    fn claim(&self) -> bool {
        self.ready.any.load(SeqCst) && self.ready.any.swap(false, SeqCst)
    }

    /// Step 2: the listed ids, out of the list.
    fn collect(&self) -> Vec<u64> {
        std::mem::take(&mut *lock(&self.ready.ids))
    }

    /// Step 3: for each id, the task in its slot if its flag is set, the flag cleared. A task
    /// out of its slot keeps its flag set, for [`TaskQueue::rearm`] to see.
    fn take(&self, ids: &[u64]) -> Vec<(Arc<Flag>, T)> {
        let mut slots = lock(&self.slots);
        ids.iter()
            .filter_map(|&id| slots.get_mut(id)?.take_if(|(f, _)| f.woken.swap(false, SeqCst)))
            .collect()
    }

    /// Step 1 of [`TaskQueue::park`].
    fn put(&self, flag: Arc<Flag>, task: T) {
        // Always there: a slot is its task's until closed.
        if let Some(slot) = lock(&self.slots).get_mut(flag.id) {
            *slot = Some((flag, task));
        }
    }

    /// Step 2: a task woken while it was out of its slot is listed again (the hook that took
    /// that wake-up's id may have found no task, and its flag, still set, lists nothing).
    fn rearm(&self, flag: &Flag) {
        if flag.woken.load(SeqCst) {
            flag.list();
            flag.signal();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a thread of the model does next.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Claim,
        Collect,
        Take,
        Put,
        Rearm,
        Mark,
        List,
        Signal,
    }

    /// One thread of the model: a progress hook (claim, collect, take, then for each task it
    /// took: put, rearm) or the task's waker (mark, then list and signal if the flag was clear).
    #[derive(Clone)]
    struct Actor {
        steps: Vec<Step>,
        at: usize,
        ids: Vec<u64>,
        taken: Vec<(Arc<Flag>, u32)>,
    }

    fn actor(steps: &[Step]) -> Actor {
        Actor { steps: steps.to_vec(), at: 0, ids: vec![], taken: vec![] }
    }

    fn hook(rearm: bool) -> Actor {
        let steps = [Step::Claim, Step::Collect, Step::Take, Step::Put, Step::Rearm];
        actor(&steps[..if rearm { 5 } else { 4 }])
    }

    fn waker() -> Actor {
        actor(&[Step::Mark, Step::List, Step::Signal])
    }

    /// Runs `a`'s next step on `q` (the task's flag is `flag`).
    fn run(q: &TaskQueue<u32>, flag: &Flag, a: &mut Actor) {
        // Whether the actor is done: a hook that found nothing, a waker whose flag was set.
        let done = match a.steps[a.at] {
            Step::Claim => !q.claim(),
            Step::Collect => {
                a.ids = q.collect();
                a.ids.is_empty()
            }
            Step::Take => {
                a.taken = q.take(&a.ids);
                a.taken.is_empty()
            }
            Step::Put => {
                a.taken.iter().for_each(|(f, t)| q.put(f.clone(), *t));
                false
            }
            Step::Rearm => {
                a.taken.iter().for_each(|(f, _)| q.rearm(f));
                false
            }
            Step::Mark => !flag.mark(),
            Step::List => {
                flag.list();
                false
            }
            Step::Signal => {
                flag.signal();
                false
            }
        };
        a.at = if done { a.steps.len() } else { a.at + 1 };
    }

    /// Every interleaving of `actors` from a queue holding one woken task: returns the number
    /// of interleavings and the first one (actor per step) that lost the wake-up, if any: no
    /// hook took the task after its waker fired, and `take_ready` does not find it either.
    fn explore(actors: &[Actor]) -> (usize, Option<Vec<usize>>) {
        fn go(actors: &[Actor], trace: &mut Vec<usize>, count: &mut usize, lost: &mut Option<Vec<usize>>) {
            // The queue's state is a function of the trace: replay it on a fresh queue.
            let (q, flag) = fresh();
            let mut now = actors.to_vec();
            let (mut fired, mut served) = (false, false);
            for &i in trace.iter() {
                let step = now[i].steps[now[i].at];
                run(&q, &flag, &mut now[i]);
                match step {
                    Step::Mark => fired = true,
                    Step::Take if fired && !now[i].taken.is_empty() => served = true,
                    _ => {}
                }
            }
            let live: Vec<usize> = (0..now.len()).filter(|&i| now[i].at < now[i].steps.len()).collect();
            if live.is_empty() {
                *count += 1;
                if !served && q.take_ready().is_empty() && lost.is_none() {
                    *lost = Some(trace.clone());
                }
                return;
            }
            for i in live {
                trace.push(i);
                go(actors, trace, count, lost);
                trace.pop();
            }
        }
        let (mut count, mut lost) = (0, None);
        go(actors, &mut Vec::new(), &mut count, &mut lost);
        (count, lost)
    }

    /// A queue holding one task whose waker fired (flag and `any` set, its id listed).
    fn fresh() -> (TaskQueue<u32>, Arc<Flag>) {
        let q = TaskQueue::new();
        let f = q.flag();
        q.park(f.clone(), 7);
        f.wake();
        (q, f)
    }

    #[test]
    fn no_interleaving_loses_a_wakeup() {
        let (n, lost) = explore(&[hook(true), hook(true), waker()]);
        assert!(n >= 300, "only {n} interleavings explored");
        assert_eq!(lost, None, "a wake-up was lost (actor per step)");
    }

    /// The check can fail: without the rearm step some interleaving of two hooks and a waker
    /// loses the wake-up.
    #[test]
    fn without_rearm_a_wakeup_is_lost() {
        let (_, lost) = explore(&[hook(false), hook(false), waker()]);
        assert!(lost.is_some(), "the model found no lost wake-up without the rearm step");
    }

    /// The interleaving that lost wake-ups, through the public calls: the hook takes the task,
    /// its waker fires during the poll, another hook takes the id before the task is parked.
    #[test]
    fn a_wakeup_during_the_poll_is_kept() {
        let (q, f) = fresh();
        let mut taken = q.take_ready();
        assert_eq!(taken.len(), 1);
        f.wake(); // during the poll
        assert!(q.take_ready().is_empty(), "another hook finds the slot empty and clears `any`");
        let (flag, task) = taken.pop().unwrap();
        q.park(flag, task);
        assert_eq!(q.take_ready().len(), 1, "the task woken during its poll is found");
        assert!(q.take_ready().is_empty());
    }

    /// A wake-up takes only its own task, once however often it fired, in the order woken.
    #[test]
    fn only_the_woken_are_taken() {
        let q = TaskQueue::new();
        let flags: Vec<Arc<Flag>> = (0..100)
            .map(|i| {
                let f = q.flag();
                q.park(f.clone(), i);
                f
            })
            .collect();
        flags[42].wake();
        flags[7].wake();
        flags[42].wake();
        let got: Vec<u32> = q.take_ready().into_iter().map(|(_, t)| t).collect();
        assert_eq!(got, [42, 7]);
        assert!(q.take_ready().is_empty());
        assert!(!flags[7].woken.load(SeqCst), "cleared before the poll");
    }

    /// A finished task's slot is reused; its waker, firing late, takes nothing.
    #[test]
    fn late_wakeups_of_finished_tasks_take_nothing() {
        let q = TaskQueue::new();
        let old = q.flag();
        q.close(&old);
        let new = q.flag();
        assert_eq!(new.id as u32, old.id as u32, "the slot is reused");
        q.park(new.clone(), 1);
        old.wake();
        assert!(q.take_ready().is_empty(), "a stale id takes nothing");
        new.wake();
        assert_eq!(q.take_ready().len(), 1);
    }
}
