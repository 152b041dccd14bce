//! Generates the libfabric bindings against the system headers found by pkg-config.
//!
//! Most of libfabric's data-path calls (`fi_domain`, `fi_write`, `fi_cq_read`, ...) are
//! `static inline` functions that dispatch through operation tables, so there is no symbol to
//! link against. bindgen's `wrap_static_fns` writes a C file with one exported wrapper per
//! inline function (`fi_write__extern`, ...), which is compiled here and linked in.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    let lib = pkg_config::Config::new().atleast_version("1.17").probe("libfabric").unwrap_or_else(|e| {
        panic!(
            "libfabric >= 1.17 not found through pkg-config ({e}).\n\
             The `ofi` feature needs the system's libfabric headers: apt-get install libfabric-dev"
        )
    });
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let wrappers = out.join("fi_static_wrappers");
    let mut b = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*|fid_.*|fid")
        .allowlist_var("FI_.*|FID_.*")
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrappers)
        .derive_default(true)
        .prepend_enum_name(false)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for p in &lib.include_paths {
        b = b.clang_arg(format!("-I{}", p.display()));
    }
    b.generate()
        .expect("bindgen failed on libfabric's headers")
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");
    let mut cc = cc::Build::new();
    cc.file(wrappers.with_extension("c")).include(env::current_dir().expect("cwd")).warnings(false);
    for p in &lib.include_paths {
        cc.include(p);
    }
    cc.compile("weft_fi_static_wrappers");
}
