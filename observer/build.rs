//! Finds the eBPF object `cargo xtask build` compiles, for `include_bytes_aligned!`.
//!
//! Without it (a fresh clone, a plain `cargo check` or `cargo test`, rust-analyzer) the observer
//! is built without its programs: everything but `observer run` works, and `run` says how to
//! build them. `cargo xtask` sets `OBSERVER_REQUIRE_EBPF`, and then a missing object is an error.

use std::path::{Path, PathBuf};

/// Where the eBPF crate's binary lands, under the target directory: the one place this path is
/// written (`cargo xtask build` builds it there).
const OBJECT_IN_TARGET_DIR: &str = "bpfel-unknown-none/release/observer-ebpf";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=OBSERVER_REQUIRE_EBPF");
    println!("cargo:rustc-check-cfg=cfg(ebpf_programs)");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let object = target_dir(&out_dir).map(|dir| dir.join(OBJECT_IN_TARGET_DIR));
    match object {
        Some(object) if object.is_file() => {
            println!("cargo:rerun-if-changed={}", object.display());
            println!("cargo:rustc-env=OBSERVER_EBPF_OBJECT={}", object.display());
            println!("cargo:rustc-cfg=ebpf_programs");
        }
        object => {
            let wanted = object.map_or_else(
                || format!("no target directory above {}", out_dir.display()),
                |object| format!("{} is missing", object.display()),
            );
            if std::env::var_os("OBSERVER_REQUIRE_EBPF").is_some() {
                panic!("the eBPF object is required (OBSERVER_REQUIRE_EBPF) but {wanted}");
            }
            // No rerun-if-changed on the missing file (cargo would rerun this script on every
            // build): `cargo xtask build` sets OBSERVER_REQUIRE_EBPF, which reruns it.
            println!(
                "cargo:warning=building the observer without its eBPF programs ({wanted}): \
                `observer run` will refuse to start; build with `cargo xtask build`"
            );
        }
    }
}

/// The target directory: the nearest ancestor of OUT_DIR that cargo marked with CACHEDIR.TAG
/// (`target/` or wherever CARGO_TARGET_DIR points).
fn target_dir(out_dir: &Path) -> Option<&Path> {
    out_dir
        .ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
}
