//! Locates the eBPF object that `cargo xtask build` produced, for `include_bytes_aligned!`.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=OBSERVER_EBPF_OBJECT");
    let object = std::env::var_os("OBSERVER_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let manifest =
                PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
            manifest.join("../target/bpfel-unknown-none/release/observer-ebpf")
        });
    if !object.is_file() {
        panic!(
            "the eBPF object {} is missing: build through `cargo xtask build` (or `cargo xtask test`), which compiles it first",
            object.display()
        );
    }
    println!("cargo:rerun-if-changed={}", object.display());
    println!("cargo:rustc-env=OBSERVER_EBPF_OBJECT={}", object.display());
}
