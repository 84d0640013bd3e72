//! Links the agent's shared library with `-Bsymbolic-functions`: its calls to functions it
//! defines itself (its own `memcpy` and kin, see `sys::mem_builtins`) bind to its own
//! definitions, never to the target's libc, whatever the target has loaded first.

fn main() {
    println!("cargo:rustc-link-arg-cdylib=-Wl,-Bsymbolic-functions");
}
