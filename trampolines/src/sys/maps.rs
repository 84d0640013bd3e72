//! The process's own mappings, as `/proc/self/maps` lists them: one parser for every
//! part of the agent that asks (where its library lies, where a trampoline chunk fits,
//! whether a patch target is code of a mapped file).
//!
//! A line is `START-END PERMS OFFSET DEV INODE [NAME]`; the name (a path, which may hold
//! spaces, or a pseudo-name such as `[stack]`) is everything after the inode.

/// One mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `rwxp`-style permissions.
    pub permissions: String,
    /// The file's path, a pseudo-name (`[stack]`, `[heap]`, `[vdso]`), or empty.
    pub name: String,
}

impl Mapping {
    pub fn executable(&self) -> bool {
        self.permissions.as_bytes().get(2) == Some(&b'x')
    }

    /// Whether the mapping is of a file (its name is a path).
    pub fn is_file(&self) -> bool {
        self.name.starts_with('/')
    }

    /// The `PROT_*` bits of its permissions.
    pub fn protection(&self) -> i32 {
        let permissions = self.permissions.as_bytes();
        let flag = |index: usize, letter: u8, protection: i32| {
            if permissions.get(index) == Some(&letter) {
                protection
            } else {
                0
            }
        };
        flag(0, b'r', libc::PROT_READ)
            | flag(1, b'w', libc::PROT_WRITE)
            | flag(2, b'x', libc::PROT_EXEC)
    }

    pub fn contains(&self, address: u64) -> bool {
        (self.start..self.end).contains(&address)
    }
}

/// The mappings of this process now.
pub fn read_own() -> std::io::Result<Vec<Mapping>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/maps")?))
}

/// Parses the text of a `maps` file; lines it cannot read are left out.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    let (range, rest) = next_field(line)?;
    let (permissions, rest) = next_field(rest)?;
    let (_offset, rest) = next_field(rest)?;
    let (_device, rest) = next_field(rest)?;
    let (_inode, rest) = next_field(rest)?;
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        permissions: permissions.to_string(),
        name: rest.trim().to_string(),
    })
}

/// The first whitespace-separated field of `text`, and what follows it.
fn next_field(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_start();
    if text.is_empty() {
        return None;
    }
    let end = text.find(char::is_whitespace).unwrap_or(text.len());
    Some((&text[..end], &text[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_with_paths_pseudo_names_and_none() {
        let text = "\
55d0c0a00000-55d0c0a02000 r-xp 00001000 fe:00 1234    /usr/bin/my program 0
7ffd1000-7ffd2000 rw-p 00000000 00:00 0                          [stack]
7f0000000000-7f0000001000 r-xp 00000000 00:00 0 
garbage
";
        let maps = parse(text);
        assert_eq!(maps.len(), 3);
        assert_eq!(maps[0].name, "/usr/bin/my program 0");
        assert!(maps[0].executable() && maps[0].is_file());
        assert!(maps[0].contains(0x55d0c0a01000) && !maps[0].contains(0x55d0c0a02000));
        assert_eq!(maps[1].name, "[stack]");
        assert!(!maps[1].executable() && !maps[1].is_file());
        assert_eq!(maps[2].name, "");
    }

    #[test]
    fn this_process_has_its_own_code_mapped() {
        let here = lines_with_paths_pseudo_names_and_none as *const () as u64;
        let maps = read_own().unwrap();
        let own = maps.iter().find(|m| m.contains(here)).unwrap();
        assert!(own.executable() && own.is_file());
    }
}
