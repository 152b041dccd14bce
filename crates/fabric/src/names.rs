//! Names of a job's public things: its id, its directory in `/dev/shm`, each rank's claim
//! socket. A job id made by [`new_job_id`] holds 64 random bits; the other names are
//! derived from it one way ([`derive`]), so seeing one (in `/dev/shm`, `/proc/net/unix`)
//! gives no way to compute the id or another name before it appears.

use crate::FabricResult;

/// SipHash-2-4 of `parts` (each length-prefixed), under a fixed key: a name derived from a
/// job id this way tells nothing of the id's random part, so one of a job's public names
/// (its directory, a rank's claim socket) gives no way to compute another.
pub fn derive(parts: &[&[u8]]) -> u64 {
    let mut msg = Vec::new();
    for p in parts {
        msg.extend_from_slice(&(p.len() as u64).to_le_bytes());
        msg.extend_from_slice(p);
    }
    siphash24(0x7765_6674_6e61_6d65, 0x6a6f_6273_6861_7368, &msg)
}

fn siphash24(k0: u64, k1: u64, msg: &[u8]) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let round = |v: &mut [u64; 4]| {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    };
    let compress = |v: &mut [u64; 4], m: u64| {
        v[3] ^= m;
        round(v);
        round(v);
        v[0] ^= m;
    };
    let mut chunks = msg.chunks_exact(8);
    for c in &mut chunks {
        compress(&mut v, u64::from_le_bytes(c.try_into().unwrap_or_default()));
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    last[7] = msg.len() as u8;
    compress(&mut v, u64::from_le_bytes(last));
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// The inode of this process's pid namespace (0 if the kernel does not say): pids mean
/// something only within one.
fn pid_namespace() -> u64 {
    // Read once: orphan cleanup asks for every job directory in /dev/shm.
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .and_then(|p| p.to_str()?.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok())
            .unwrap_or(0)
    })
}

/// The owner part `[solo]PIDnNS` of a job id made by [`new_job_id`] (what precedes its `x`),
/// read as (pid, pid namespace); `None` for an id of any other form.
fn owner_of(base: &str) -> Option<(&str, u32, u64)> {
    let (head, _) = base.split_once('x')?;
    let (pid, ns) = head.strip_prefix("solo").unwrap_or(head).split_once('n')?;
    Some((head, u32::from_str_radix(pid, 16).ok()?, u64::from_str_radix(ns, 16).ok()?))
}

/// A new job id, unique on this node and unguessable: `prefix`, the pid of this process
/// (the job's launcher, or its only rank) in hex, `n`, its pid namespace, `x`, 64 random
/// bits; a later `weft run` removes the files of a job whose owner is gone (see
/// [`crate::os::remove_orphaned_files`]).
pub fn new_job_id(prefix: &str) -> FabricResult<String> {
    let r = crate::os::random_u64()?;
    Ok(format!("{prefix}{:x}n{:x}x{r:016x}", crate::os::pid(), pid_namespace()))
}

/// The pid of the process that owns job `job` (see [`new_job_id`]), if the name says it and
/// the pid means something here: it was taken in this pid namespace. A name of any other
/// form (a job started by hand, another pid namespace sharing /dev/shm) has no owner.
pub(crate) fn job_owner(job: &str) -> Option<u32> {
    let (_, pid, ns) = owner_of(job)?;
    (ns != 0 && ns == pid_namespace()).then_some(pid)
}

/// The directory, in `/dev/shm`, of job `job`'s shared-memory files: `weft-` and the owner
/// part of a launcher's id (`PIDnNS`, which `weft run` reads to find jobs whose launcher is
/// gone), `x`, and a name derived from the whole id; a suffix `-hN` (a host's part of a job
/// over several hosts) is kept, so that the job's directories share a prefix.
pub fn job_dir(job: &str) -> String {
    let (base, suffix) = job.split_once('-').map_or((job, ""), |(b, s)| (b, s));
    let derived = derive(&[b"dir", base.as_bytes()]);
    let owner = owner_of(base).map(|(head, _, _)| head);
    let dash = if suffix.is_empty() { "" } else { "-" };
    match owner {
        Some(head) => format!("weft-{head}x{derived:016x}{dash}{suffix}"),
        None => format!("weft-{derived:016x}{dash}{suffix}"),
    }
}

/// The abstract socket name of rank `rank`'s claim on its place in job `job` (see
/// `shm::claim`): derived from the id, so another user who sees it cannot name the others.
pub fn claim_name(job: &str, rank: u32) -> String {
    format!("weft-{:016x}", derive(&[b"claim", job.as_bytes(), &rank.to_le_bytes()]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siphash_matches_the_reference() {
        // The reference implementation's vectors: key 00..0f, messages 00..0e and empty.
        let k0 = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        let k1 = u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]);
        let msg: Vec<u8> = (0..15).collect();
        assert_eq!(siphash24(k0, k1, &msg), 0xa129_ca61_49be_45e5);
        assert_eq!(siphash24(k0, k1, &[]), 0x726f_db47_dd0e_0e31);
    }

    #[test]
    fn derived_names_keep_only_what_must_be_seen() {
        let job = "2b45n4026531836x0123456789abcdef";
        let dir = job_dir(job);
        assert!(dir.starts_with("weft-2b45n4026531836x") && !dir.contains("0123456789abcdef"), "{dir}");
        assert_eq!(job_dir(&format!("{job}-h3")), format!("{dir}-h3"));
        let hand = job_dir("myjob");
        assert!(hand.starts_with("weft-") && !hand.contains("myjob"), "{hand}");
        assert_ne!(claim_name(job, 0), claim_name(job, 1));
        assert!(!claim_name(job, 0).contains("0123456789abcdef"));
    }
}
