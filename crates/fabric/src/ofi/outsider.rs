//! A process outside the job that reaches a rank's endpoint (tcp on loopback) must not write
//! its memory: it knows the address, not the keys. Both sides are separate libfabric objects
//! in this test process; the provider cannot tell them from two processes.

use super::ffi::{Access, Context, Objects, Wanted, EAGAIN};
use crate::os;
use std::time::{Duration, Instant};
use weft_ofi_sys as sys;

fn open() -> Option<Objects> {
    let w = Wanted { provider: Some("tcp".into()), domain: Some("lo".into()), mr_local: false };
    match Objects::open(&w) {
        Ok(o) => Some(o),
        Err(e) => {
            eprintln!("skipped: no libfabric tcp provider on lo ({e})");
            None
        }
    }
}

/// Writes `value` from `outsider` to (`victim`, remote address `addr`, `key`), making progress
/// on both, and says whether the write reported success (`None`: no completion within 5 s).
fn try_write(
    outsider: &Objects,
    victim: &Objects,
    (dst, addr): (u64, u64),
    key: u64,
    value: u64,
) -> Option<bool> {
    let src = value.to_le_bytes();
    let ctx = Context::into_raw(());
    let mut entries = [sys::fi_cq_data_entry::default(); 4];
    let end = Instant::now() + Duration::from_secs(5);
    let ret = loop {
        let ret = outsider.ep().write(src.as_ptr() as usize, 8, 0, dst, addr, key, true, false, ctx);
        if ret != EAGAIN || Instant::now() > end {
            break ret;
        }
        // Connecting: both sides make progress until the post is taken.
        let _ = victim.ep().cq_read(&mut entries);
        let _ = outsider.ep().cq_read(&mut entries);
    };
    if ret != 0 {
        // SAFETY: the post failed, so libfabric never took the context: it is ours again.
        drop(unsafe { Context::<()>::from_raw(ctx) });
        return Some(false);
    }
    while Instant::now() < end {
        // The victim's calls make its side of the provider progress (manual progress).
        let _ = victim.ep().cq_read(&mut entries);
        let done = match outsider.ep().cq_read(&mut entries) {
            Ok(0) => None,
            Ok(_) => Some(true),
            Err(_) => Some(false),
        };
        if let Some(ok) = done {
            // SAFETY: the completion of this context was read: libfabric is done with it.
            drop(unsafe { Context::<()>::from_raw(ctx) });
            return Some(ok);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Never completed: leak the context rather than free what libfabric may still hold.
    None
}

#[test]
fn outsider_cannot_write_with_guessed_keys() {
    let Some(victim) = open() else { return };
    let region = os::map_anonymous(4096).expect("map");
    let staging = os::map_anonymous(4096).expect("map");
    let mr = victim.register(region.as_ptr() as usize, region.len(), Access::Remote).expect("register");
    let local = victim.register(staging.as_ptr() as usize, staging.len(), Access::Local).expect("register");
    let name = victim.name().expect("name");
    // What a peer would write to: the region's address where the provider wants virtual
    // addresses, else offset 0.
    let at = |m: &os::Mapping| if victim.neg.virt_addr() { m.as_ptr() as u64 } else { 0 };
    let word = |m: &os::Mapping| {
        // SAFETY: the mapping is 4096 readable bytes; nothing writes it concurrently except
        // the provider's completed writes, which this test waited for.
        u64::from_le_bytes(unsafe { std::slice::from_raw_parts(m.as_ptr(), 8) }.try_into().unwrap())
    };
    // Each try from a fresh outsider: the provider drops a connection that presented a bad
    // key, so later writes on it would fail for that reason alone.
    let attempt = |m: &os::Mapping, key: u64, value: u64| {
        let outsider = open().expect("a second tcp endpoint");
        let dst = outsider.insert(std::slice::from_ref(&name)).expect("insert")[0];
        try_write(&outsider, &victim, (dst, at(m)), key, value)
    };
    // The path works: with the region's key the write lands (so the refusals below are the
    // keys', not a broken connection's).
    assert_eq!(attempt(&region, mr.key(), 0x600d), Some(true));
    assert_eq!(word(&region), 0x600d);
    // The keys the fabric used to give in order (1, 2 and 16 + region id), a few more, and
    // the real key's neighbours.
    let guesses: Vec<u64> = (0..40).chain([u64::MAX, mr.key() ^ 1, mr.key().wrapping_add(1)]).collect();
    assert!(!guesses.contains(&mr.key()), "the region's key {:#x} is guessable", mr.key());
    for key in guesses {
        assert_ne!(attempt(&region, key, 0xbad), Some(true), "a write with guessed key {key} completed");
        assert_eq!(word(&region), 0x600d, "key {key} wrote the region");
    }
    // Memory registered for local use only refuses even its own key.
    assert_ne!(attempt(&staging, local.key(), 0xbad), Some(true), "a write into local-only memory completed");
    assert_eq!(word(&staging), 0, "local-only memory was written");
    // Memory exposed for peers' reads (zero-copy RPC chunks) refuses writes with its key.
    let exposed = os::map_anonymous(4096).expect("map");
    let ro = victim.register(exposed.as_ptr() as usize, exposed.len(), Access::RemoteRead).expect("register");
    assert_ne!(attempt(&exposed, ro.key(), 0xbad), Some(true), "a write into read-only memory completed");
    assert_eq!(word(&exposed), 0, "read-only memory was written");
    drop((mr, local, ro));
}
