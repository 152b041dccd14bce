//! Replays the cargo-fuzz inputs — the seeds written by weft's encoder (`fuzz/seeds`) and the
//! corpus a fuzz run grew from them (`fuzz/corpus`) — through the fuzz target's body, plus
//! every truncation and many one-byte changes of each: the decoders must give a value or an
//! error for all of them, never panic.

use std::path::PathBuf;

fn files(kind: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz").join(kind).join("archive_decode");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz inputs {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    files.into_iter().map(|p| (p.clone(), std::fs::read(&p).expect("corpus file"))).collect()
}

fn corpus() -> Vec<(PathBuf, Vec<u8>)> {
    let mut all = files("seeds");
    all.extend(files("corpus"));
    all
}

#[test]
fn corpus_replays_without_panics() {
    let files = corpus();
    // 11 seeds and a fuzz-grown corpus of a few hundred: a corpus that vanished would make
    // this test vacuous.
    assert!(files.len() >= 100, "only {} corpus files", files.len());
    for (path, data) in &files {
        let r = std::panic::catch_unwind(|| weft_rpc::fuzz::decode_untrusted(data));
        assert!(r.is_ok(), "{} made a decoder panic", path.display());
    }
}

#[test]
fn corpus_mutations_replay_without_panics() {
    // Every truncation and four values at every byte for the seeds; for the (larger) fuzz
    // corpus, every 7th byte, to keep the test short.
    let seeds = files("seeds").len();
    for (k, (path, data)) in corpus().iter().enumerate() {
        let step = if k < seeds { 1 } else { 7 };
        for cut in 0..data.len() {
            weft_rpc::fuzz::decode_untrusted(&data[..cut]);
        }
        let mut m = data.clone();
        for i in (0..m.len()).step_by(step) {
            for x in [0x00, 0xff, 0x80, m[i].wrapping_add(1)] {
                let old = std::mem::replace(&mut m[i], x);
                let r = std::panic::catch_unwind(|| weft_rpc::fuzz::decode_untrusted(&m));
                assert!(r.is_ok(), "{} with byte {i} = {x:#x} made a decoder panic", path.display());
                m[i] = old;
            }
        }
    }
}

#[test]
fn seeds_are_valid_archives() {
    // The seeds were written by weft's own encoder: the descriptors among them must parse.
    let descs = files("seeds")
        .iter()
        .filter(|(p, _)| p.file_name().is_some_and(|n| n == "seed-02" || n == "seed-03"))
        .filter(|(_, d)| weft_rpc::proto::parse_desc(d).is_ok())
        .count();
    assert_eq!(descs, 2, "rendezvous descriptor seeds no longer parse");
}
