//! Two-sided model on weft active messages: each epoch the receiver posts one receive per
//! expected message (source, index) with the place it goes; senders name only the message.
//! A message larger than a medium AM travels as fragments `[epoch, index, byte offset]`; the
//! handler matches each against the posted receive and copies it in. Fragments may come in
//! any order (weft, like GASNet, does not order active messages: over libfabric two threads
//! may deliver one source's messages either way round); each must start at a fragment
//! boundary and come once (a bit per fragment catches duplicates). A message for an epoch
//! not yet posted (a sender one transform ahead) is kept aside and placed when its receive is
//! posted, as MPI's unexpected-message queue does.

use super::{Inbox, Pattern, Shape, Transport, POINT};
use crate::local_fft::C64;
use crate::Error;
use std::sync::{Arc, Mutex, MutexGuard};
use weft_runtime::{AmHandler, AmMsg, Builder, Comm};

/// A fragment that arrived before its receive was posted.
struct Early {
    src: usize,
    epoch: u64,
    index: usize,
    offset: usize,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct State {
    inbox: Option<Arc<Inbox>>,
    epoch: u64,
    posted: Option<(Shape, Pattern)>,
    /// Bytes still expected, per source and message index.
    remaining: Vec<Vec<usize>>,
    /// Fragments received, a bit each, per source and message index.
    seen: Vec<Vec<Vec<u64>>>,
    /// Bytes of a whole fragment (the senders' medium AM size).
    fragment: usize,
    done: usize,
    expected: usize,
    early: Vec<Early>,
    error: Option<String>,
}

impl State {
    fn deliver(&mut self, src: usize, epoch: u64, index: usize, offset: usize, bytes: &[u8]) {
        match self.posted {
            Some((shape, pattern)) if epoch == self.epoch => {
                let unit = pattern.unit * POINT;
                let frag = self.fragment.max(1);
                let end = offset.checked_add(bytes.len());
                // A fragment starts at a boundary and fills it, or ends the message.
                let whole = offset.is_multiple_of(frag)
                    && end.is_some_and(|e| e <= unit && (bytes.len() == frag || e == unit));
                let left = self.remaining.get_mut(src).and_then(|r| r.get_mut(index));
                let seen = self.seen.get_mut(src).and_then(|s| s.get_mut(index));
                let (Some(left), Some(seen), true) = (left, seen, whole) else {
                    self.error.get_or_insert(format!(
                        "malformed message from rank {src}: index {index}, bytes {offset}+{} of a {unit}-byte message",
                        bytes.len()
                    ));
                    return;
                };
                let (word, bit) = ((offset / frag) / 64, 1u64 << ((offset / frag) % 64));
                if seen[word] & bit != 0 {
                    self.error.get_or_insert(format!(
                        "rank {src} sent message {index} twice (fragment at byte {offset} again)"
                    ));
                    return;
                }
                seen[word] |= bit;
                let inbox = self.inbox.as_ref().expect("posted receives have an inbox");
                let at = inbox.message_at(epoch, &shape, &pattern, src, index) + offset;
                inbox.view().copy_in(at, bytes);
                *left -= bytes.len();
                if *left == 0 {
                    self.done += 1;
                }
            }
            _ if epoch > self.epoch => {
                self.early.push(Early { src, epoch, index, offset, bytes: bytes.to_vec() });
            }
            _ => {
                self.error.get_or_insert(format!("rank {src} sent a message for finished epoch {epoch}"));
            }
        }
    }
}

/// The receive side shared between the AM handler and the transport.
pub struct Mailbox {
    state: Mutex<State>,
    handler: AmHandler,
}

impl Mailbox {
    /// Registers the message handler on `b` (before `init`).
    pub fn register(b: &mut Builder) -> Arc<Mailbox> {
        let cell: Arc<std::sync::OnceLock<Arc<Mailbox>>> = Arc::default();
        let for_handler = cell.clone();
        let handler = b.handler("ft.two_sided", move |am: &AmMsg<'_>| {
            if let Some(mb) = for_handler.get() {
                mb.on_message(am);
            }
        });
        let mb = Arc::new(Mailbox { state: Mutex::default(), handler });
        cell.set(mb.clone()).ok().expect("set once");
        mb
    }

    /// The handler messages arrive on (`[epoch, index, byte offset]` + payload).
    pub fn handler(&self) -> AmHandler {
        self.handler
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn on_message(&self, am: &AmMsg<'_>) {
        let mut st = self.lock();
        match *am.args() {
            [epoch, index, offset] => {
                st.deliver(am.src() as usize, epoch, index as usize, offset as usize, am.payload())
            }
            _ => {
                st.error.get_or_insert(format!(
                    "rank {} sent a message with {} arguments",
                    am.src(),
                    am.args().len()
                ));
            }
        }
    }
}

/// Messages matched at the receiver.
pub struct TwoSided {
    comm: Arc<Comm>,
    mailbox: Arc<Mailbox>,
    inbox: Arc<Inbox>,
    epoch: u64,
    fragment: usize,
}

impl TwoSided {
    /// A transport receiving into `inbox` through `mailbox`'s handler.
    pub fn new(comm: Arc<Comm>, mailbox: Arc<Mailbox>, inbox: Arc<Inbox>) -> TwoSided {
        let fragment = comm.caps().am_max_medium.max(16);
        {
            let mut st = mailbox.lock();
            st.inbox = Some(inbox.clone());
            st.posted = None;
            st.fragment = fragment;
        }
        TwoSided { comm, mailbox, inbox, epoch: 0, fragment }
    }
}

impl Transport for TwoSided {
    fn begin(&mut self, epoch: u64, shape: Shape, pattern: Pattern) -> Result<(), Error> {
        if shape.local_points() > self.inbox.points() {
            return Err(Error::Protocol("transform larger than the inbox".into()));
        }
        let mut st = self.mailbox.lock();
        if epoch <= st.epoch {
            return Err(Error::Protocol(format!("epoch {epoch} after epoch {}", st.epoch)));
        }
        st.epoch = epoch;
        st.posted = Some((shape, pattern));
        st.remaining = (0..shape.ranks)
            .map(|r| if r == shape.me { vec![] } else { vec![pattern.unit * POINT; pattern.count] })
            .collect();
        let words = (pattern.unit * POINT).div_ceil(st.fragment.max(1)).div_ceil(64);
        st.seen = (0..shape.ranks)
            .map(|r| if r == shape.me { vec![] } else { vec![vec![0u64; words]; pattern.count] })
            .collect();
        st.done = 0;
        st.expected = (shape.ranks - 1) * pattern.count;
        let (now, later): (Vec<Early>, Vec<Early>) =
            std::mem::take(&mut st.early).into_iter().partition(|e| e.epoch == epoch);
        st.early = later;
        for e in now {
            st.deliver(e.src, e.epoch, e.index, e.offset, &e.bytes);
        }
        self.epoch = epoch;
        Ok(())
    }

    fn send(&mut self, dst: usize, index: usize, data: &[C64]) -> Result<(), Error> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let h = self.mailbox.handler;
        for (k, frag) in bytes.chunks(self.fragment).enumerate() {
            let args = [self.epoch, index as u64, (k * self.fragment) as u64];
            self.comm.am_request_medium(dst as u32, h, &args, frag)?;
        }
        Ok(())
    }

    fn progress(&mut self) -> Result<(), Error> {
        self.comm.poll()?;
        Ok(())
    }

    fn finish(&mut self) -> Result<(), Error> {
        let mb = &self.mailbox;
        self.comm.wait_until(|| {
            let st = mb.lock();
            st.done == st.expected || st.error.is_some()
        })?;
        let mut st = mb.lock();
        st.posted = None;
        match st.error.take() {
            Some(e) => Err(Error::Protocol(e)),
            None => Ok(()),
        }
    }

    fn inbox(&self) -> (&Inbox, u64) {
        (&self.inbox, self.epoch)
    }
}
