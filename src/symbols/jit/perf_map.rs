//! The perf map format (`/tmp/perf-PID.map`): one line per piece of generated code,
//! `START SIZE NAME`, START and SIZE in hexadecimal (with or without `0x`), NAME the
//! rest of the line. Node (`--perf-basic-prof`), Python 3.12+ (`-X perf`), Java (`jcmd
//! PID Compiler.perfmap`), .NET (`DOTNET_PerfMapEnabled=1`) and LuaJIT write it; perf
//! and samply read it.
//!
//! The one idea: the file is appended to while it is read, so only whole lines count —
//! the bytes after the last newline are left for the next read — and a line too long
//! to be one (a file that is not a map, or garbage) is skipped up to its end rather
//! than held in memory.

/// The longest line kept; a longer one is skipped.
pub const MAX_LINE: usize = 64 * 1024;

/// One line's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry<'a> {
    pub start: u64,
    pub size: u64,
    pub name: &'a [u8],
}

/// Reads the whole lines of `bytes` (what follows the bytes read so far); returns how
/// many bytes they took (through the last newline). `skipping`: the previous read
/// ended inside a line too long to keep, whose rest is dropped; it says the same of
/// this read's end.
pub fn parse_lines(bytes: &[u8], skipping: &mut bool, mut each: impl FnMut(MapEntry)) -> usize {
    let Some(last_newline) = bytes.iter().rposition(|&b| b == b'\n') else {
        // No whole line: a line longer than any map's is skipped to its end.
        if *skipping || bytes.len() >= MAX_LINE {
            *skipping = true;
            return bytes.len();
        }
        return 0;
    };
    let mut lines = bytes[..last_newline].split(|&b| b == b'\n');
    if std::mem::take(skipping) {
        lines.next();
    }
    for line in lines {
        if let Some(entry) = parse_line(line) {
            each(entry);
        }
    }
    let rest = &bytes[last_newline + 1..];
    if rest.len() >= MAX_LINE {
        *skipping = true;
        return bytes.len();
    }
    last_newline + 1
}

/// `START SIZE NAME`; `None` for a line that is not one (or has an empty size).
pub fn parse_line(line: &[u8]) -> Option<MapEntry<'_>> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (start, rest) = split_word(line)?;
    let (size, name) = split_word(rest)?;
    let (start, size) = (hex(start)?, hex(size)?);
    (size > 0 && !name.is_empty()).then_some(MapEntry { start, size, name })
}

/// The first word of `text` and what follows the spaces after it.
fn split_word(text: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = text.iter().position(|&b| b == b' ' || b == b'\t')?;
    let rest = &text[end..];
    let skip = rest
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(rest.len());
    Some((&text[..end], &rest[skip..]))
}

fn hex(word: &[u8]) -> Option<u64> {
    let digits = word
        .strip_prefix(b"0x")
        .or_else(|| word.strip_prefix(b"0X"))
        .unwrap_or(word);
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(bytes: &[u8], skipping: &mut bool) -> (Vec<(u64, u64, String)>, usize) {
        let mut out = Vec::new();
        let used = parse_lines(bytes, skipping, |e| {
            out.push((
                e.start,
                e.size,
                String::from_utf8_lossy(e.name).into_owned(),
            ))
        });
        (out, used)
    }

    #[test]
    fn lines_of_node_python_and_java_parse() {
        let text = b"7fe5ec006040 1d8 JS:*leafy /tmp/jt.js:1:15\n\
                     0x7f00aa000000 0x40 py::leaf:/srv/app.py\n\
                     7f1234 10 Interpreter\n\
                     garbage\n\
                     10 0 empty\n\
                     7f0000 20 partial";
        let mut skipping = false;
        let (entries, used) = all(text, &mut skipping);
        assert_eq!(
            entries,
            [
                (0x7fe5ec006040, 0x1d8, "JS:*leafy /tmp/jt.js:1:15".into()),
                (0x7f00aa000000, 0x40, "py::leaf:/srv/app.py".into()),
                (0x7f1234, 0x10, "Interpreter".into()),
            ]
        );
        // The last line is not whole yet: it is left for the next read.
        assert_eq!(&text[used..], b"7f0000 20 partial");
        assert!(!skipping);
    }

    #[test]
    fn a_line_too_long_is_skipped_to_its_end() {
        let mut skipping = false;
        let long = vec![b'x'; MAX_LINE];
        let (entries, used) = all(&long, &mut skipping);
        assert!(entries.is_empty() && skipping && used == long.len());
        // Its end, then a good line.
        let (entries, _) = all(b"xxxx\n1000 8 after\n", &mut skipping);
        assert_eq!(entries, [(0x1000, 8, "after".into())]);
        assert!(!skipping);
    }
}
