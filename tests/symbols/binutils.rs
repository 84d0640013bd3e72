//! What binutils (`nm`, `objdump`, `readelf`) say about an ELF file: the reference the
//! symbol tests compare `tendril::symbols` with.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;

/// Runs a binutils tool and returns its stdout.
pub fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A defined function symbol as `nm -S` prints it.
#[derive(Debug, Clone)]
pub struct NmSymbol {
    pub addr: u64,
    pub size: Option<u64>,
    pub name: String,
}

/// `(value, name)` of every defined FUNC or IFUNC symbol, per `readelf`.
pub fn readelf_functions(path: &Path) -> HashSet<(u64, String)> {
    let text = tool("readelf", &["-sW", path.to_str().unwrap()]);
    let mut out = HashSet::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Num: Value Size Type Bind Vis Ndx Name
        if f.len() >= 8 && (f[3] == "FUNC" || f[3] == "IFUNC") && f[6] != "UND" {
            let value = u64::from_str_radix(f[1], 16).unwrap();
            let name = f[7].split('@').next().unwrap().to_string();
            out.insert((value, name));
        }
    }
    out
}

/// The text symbols (`T t W i`) `nm -S --defined-only` lists that are functions (nm also
/// gives `W` to weak data such as `data_start`; readelf tells the types apart).
pub fn nm_functions(path: &Path) -> Vec<NmSymbol> {
    let funcs = readelf_functions(path);
    let text = tool("nm", &["-S", "--defined-only", path.to_str().unwrap()]);
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (addr, size, kind, name) = match f.as_slice() {
            [a, s, k, n] => (a, Some(u64::from_str_radix(s, 16).unwrap()), k, n),
            [a, k, n] => (a, None, k, n),
            _ => continue,
        };
        let addr = u64::from_str_radix(addr, 16).unwrap();
        if ["T", "t", "W", "i"].contains(kind) && funcs.contains(&(addr, name.to_string())) {
            out.push(NmSymbol {
                addr,
                size,
                name: name.to_string(),
            });
        }
    }
    out
}

/// A `jmp *…(%rip)` in a PLT section as `objdump -d` shows it, with the `name@plt`
/// label of the stub it starts (objdump labels no stubs in static executables).
#[derive(Debug)]
pub struct ObjdumpJump {
    pub addr: u64,
    pub got_slot: u64,
    pub stub: Option<(u64, String)>,
}

pub fn objdump_plt(path: &Path) -> Vec<ObjdumpJump> {
    let text = tool(
        "objdump",
        &[
            "-d",
            "-j",
            ".plt",
            "-j",
            ".plt.sec",
            "-j",
            ".plt.got",
            path.to_str().unwrap(),
        ],
    );
    let mut out = Vec::new();
    let mut label: Option<(u64, String)> = None;
    for line in text.lines() {
        if let Some(l) = line.strip_suffix(">:") {
            let (addr, name) = l.split_once(" <").unwrap();
            label = name
                .ends_with("@plt")
                .then(|| (u64::from_str_radix(addr, 16).unwrap(), name.to_string()));
        } else if line.contains("jmp") && line.contains("(%rip)") {
            // `  1084:\tf3 0f … \tjmp    *0x2f2e(%rip)        # 3fb8 <printf@GLIBC_2.2.5>`
            let addr = line.trim_start().split(':').next().unwrap();
            let slot = line
                .split("# ")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            out.push(ObjdumpJump {
                addr: u64::from_str_radix(addr, 16).unwrap(),
                got_slot: u64::from_str_radix(slot, 16).unwrap(),
                stub: label.take(),
            });
        }
    }
    out
}

/// GOT slot → resolver address of every `R_X86_64_IRELATIVE` relocation, per `readelf`.
pub fn readelf_irelative(path: &Path) -> HashMap<u64, u64> {
    let text = tool("readelf", &["-rW", path.to_str().unwrap()]);
    text.lines()
        .filter(|l| l.contains("R_X86_64_IRELATIVE"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
            (hex(f[0]), hex(f[f.len() - 1]))
        })
        .collect()
}

/// `[start, end)` of every FDE, per `readelf --debug-dump=frames`.
pub fn readelf_fdes(path: &Path) -> HashSet<(u64, u64)> {
    let text = tool("readelf", &["--debug-dump=frames", path.to_str().unwrap()]);
    text.lines()
        .filter_map(|line| line.split("pc=").nth(1))
        .map(|range| {
            let (a, b) = range.trim().split_once("..").unwrap();
            (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
            )
        })
        .collect()
}
