#![no_main]
//! Arbitrary bytes through every RPC decoder: a value or an error, never a panic.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    weft_rpc::fuzz::decode_untrusted(data);
});
