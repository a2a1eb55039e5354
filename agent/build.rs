//! Packs the code the agent runs into one stretch of its binary: see
//! `src/hot_text.rs`.

#[path = "src/hot_text.rs"]
mod hot_text;

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let list_path = manifest_dir.join("hot-text.txt");
    println!("cargo:rerun-if-changed={}", list_path.display());
    println!("cargo:rerun-if-changed=src/hot_text.rs");
    // Only release builds are what the agent ships and what its bars measure;
    // Linux's linkers (GNU ld, lld) take the script.
    let is_release = std::env::var("PROFILE").as_deref() == Ok("release");
    let is_linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if !is_release || !is_linux {
        return;
    }
    let list = std::fs::read_to_string(&list_path)
        .unwrap_or_else(|error| panic!("read {}: {error}", list_path.display()));
    let script_path = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("hot-text.ld");
    std::fs::write(&script_path, hot_text::linker_script(&list))
        .unwrap_or_else(|error| panic!("write {}: {error}", script_path.display()));
    println!(
        "cargo:rustc-link-arg-bin=vtax=-Wl,-T,{}",
        script_path.display()
    );
}
