//! The binary's link: the functions a request runs through are laid out together, first in its
//! code, in the order `hot-symbols.txt` lists them (the hottest first; `bench/README.md` says how
//! the list is made and what it bought). Spread over the binary's code they take some two
//! hundred pages; together a few dozen, so each request needs fewer page-table walks, which at
//! one connection start on translation caches the load generator and the backend have used.
//!
//! Only for release builds on x86_64 Linux, where rustc links with its own LLD by default
//! (`--symbol-ordering-file` is LLD's); a name the list has and the binary lacks (the code
//! changed since the list was made) is passed over, so a stale list costs speed, never the
//! build. `SPILLWAY_LINK_UNORDERED=1` leaves the layout to the linker (for a linker other than
//! LLD, or to compare).
//!
//! `SPILLWAY_LINK_RELOCS=1` (Linux) keeps the link's relocations in the binary
//! (`--emit-relocs`), which BOLT needs to lay out its code again from a profile
//! (`bench/bolt.sh`); it doubles the file's size and changes nothing else.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=hot-symbols.txt");
    println!("cargo:rerun-if-env-changed=SPILLWAY_LINK_UNORDERED");
    println!("cargo:rerun-if-env-changed=SPILLWAY_LINK_RELOCS");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("SPILLWAY_LINK_RELOCS") == "1" && var("CARGO_CFG_TARGET_OS") == "linux" {
        println!("cargo:rustc-link-arg-bins=-Wl,--emit-relocs");
    }
    let wanted = var("PROFILE") == "release"
        && var("TARGET") == "x86_64-unknown-linux-gnu"
        && var("SPILLWAY_LINK_UNORDERED").is_empty();
    if !wanted {
        return;
    }
    let list = Path::new(&var("CARGO_MANIFEST_DIR")).join("hot-symbols.txt");
    println!(
        "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
        list.display()
    );
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
}
