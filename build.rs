//! Builds the agent (`trampolines/`, a cdylib) and embeds it in the `tendril` binary, so
//! that a single installed binary can attach on its own (`cargo install --path .`).
//!
//! The agent is always built in release mode — it runs inside the target, on its hot
//! paths — with a nested cargo using a target directory of its own, `agent-build` beside
//! the outer build's profile directories (`target/agent-build`), which avoids the lock
//! the outer build holds on its profile directory. Every outer build shares it — dev,
//! test, release and clippy's — so the agent and its dependencies are compiled once, not
//! once per outer build (issue #36); a second outer build waits for the first's lock.

use std::env;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::process::Command;

fn main() {
    compress_release_debug_info();
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    for watched in [
        "trampolines/src",
        "trampolines/Cargo.toml",
        "callgraph/src",
        "callgraph/Cargo.toml",
        "wire/src",
        "wire/Cargo.toml",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            manifest_dir.join(watched).display()
        );
    }

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // OUT_DIR is <target>/[<triple>/]<profile>/build/tendril-<hash>/out.
    let agent_target_dir = out_dir
        .ancestors()
        .nth(4)
        .unwrap_or(&out_dir)
        .join("agent-build");
    let mut build = Command::new(cargo);
    build
        .arg("build")
        .arg("--release")
        .arg("--package")
        .arg("tendril-agent")
        .arg("--manifest-path")
        .arg(manifest_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&agent_target_dir);
    if env::var_os("CARGO_NET_OFFLINE").is_some() {
        build.arg("--offline");
    }
    // The agent is embedded in every tendril binary and written into every target's
    // runtime directory: keep its symbols, drop its debug info.
    build.env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    // Settings meant for the outer build must not leak into the agent's. Clippy's
    // wrapper too: it would make the shared build differ between `cargo clippy` and
    // `cargo test` (the outer clippy lints the agent's crate itself).
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        build.env_remove(var);
    }
    let status = build
        .status()
        .expect("cannot run cargo to build the tendril agent");
    assert!(
        status.success(),
        "building the tendril agent (trampolines/) failed"
    );

    let agent = agent_target_dir.join("release/libtendril_agent.so");
    let bytes = std::fs::read(&agent).expect("the agent library was not produced");
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    let embedded = out_dir.join("libtendril_agent.so");
    std::fs::write(&embedded, &bytes).unwrap();
    std::fs::write(
        out_dir.join("agent_bundle.rs"),
        format!(
            "/// The agent library's bytes.\npub const AGENT_BYTES: &[u8] = include_bytes!({embedded:?});\n\
             /// A digest of the bytes, naming the file so different builds never collide.\n\
             pub const AGENT_DIGEST: &str = \"{:016x}\";\n",
            hasher.finish()
        ),
    )
    .unwrap();
}

/// The release binary keeps its line tables (backtraces and `perf` of tendril need them)
/// but links them compressed: 63 MB with them as they are, most of it debug sections
/// (issue 34). The test and dev builds, linked over and over, are left as they are.
fn compress_release_debug_info() {
    if env::var("PROFILE").as_deref() == Ok("release") {
        println!("cargo:rustc-link-arg-bins=-Wl,--compress-debug-sections=zlib");
    }
}
