//! Symbol text that shares its module's string table instead of owning a copy.
//!
//! The one idea: a big library has hundreds of thousands of functions, and giving each
//! name its own heap string made loading them mostly malloc and free. A [`SymbolText`]
//! is a reference-counted handle on one buffer (a whole cached index, read once) plus
//! the range of its text in it, so a module's names cost one allocation in all. The
//! buffer's text region is checked to be UTF-8 once, when the table is made, and every
//! range is checked to lie inside it on character boundaries when a handle is made, so
//! reading a name never fails and never re-validates. It reads as a `str` (`Deref`).
//!
//! A display name is demangled only when it is first read: most of a big library's
//! names are never shown, and demangling them all was most of a cold load. Such a name
//! is the range of its mangled form plus a slot of the table, where its demangled form
//! is kept once made ([`SymbolText::mangled`] says whether a name is one).

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, Range};
use std::sync::{Arc, OnceLock};

use super::demangle::demangle;

/// A buffer whose `text` range is valid UTF-8 (checked by [`StringTable::new`], or
/// taken from a `String`), and the demangled forms of the names cut from it that are
/// demangled when first read.
struct Table {
    bytes: Vec<u8>,
    text: Range<usize>,
    demangled: Box<[OnceLock<Box<str>>]>,
}

impl Table {
    fn text(&self) -> &str {
        let text = &self.bytes[self.text.clone()];
        // SAFETY: a `Table` is made only by `StringTable::new`, which checked with
        // `str::from_utf8` that exactly these bytes are UTF-8, or by
        // `StringTable::from_string` from all the bytes of a `String`, which are UTF-8;
        // `bytes` is never changed afterwards (private, only ever borrowed immutably).
        unsafe { std::str::from_utf8_unchecked(text) }
    }

    fn with_slots(bytes: Vec<u8>, text: Range<usize>, slots: usize) -> Table {
        Table {
            bytes,
            text,
            demangled: (0..slots).map(|_| OnceLock::new()).collect(),
        }
    }
}

/// The strings of one module, shared by the [`SymbolText`]s cut from it.
#[derive(Clone)]
pub(super) struct StringTable(Arc<Table>);

impl StringTable {
    /// `bytes` (taken, not copied) whose `text` range holds the strings, with room for
    /// `slots` names demangled when read; `None` if that range is outside `bytes` or not
    /// UTF-8.
    pub(super) fn new(bytes: Vec<u8>, text: Range<usize>, slots: usize) -> Option<StringTable> {
        std::str::from_utf8(bytes.get(text.clone())?).ok()?;
        Some(StringTable(Arc::new(Table::with_slots(bytes, text, slots))))
    }

    /// All of `text` as the table (no check needed: a `String` is UTF-8), with room for
    /// `slots` names demangled when read.
    pub(super) fn from_string(text: String, slots: usize) -> StringTable {
        let len = text.len();
        StringTable(Arc::new(Table::with_slots(
            text.into_bytes(),
            0..len,
            slots,
        )))
    }

    /// The whole buffer the strings were taken from.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.0.bytes
    }

    /// The text at `start..start + len` of the strings (offsets within the text range);
    /// `None` if that is not a whole run of characters inside it.
    pub(super) fn text(&self, start: u32, len: u32) -> Option<SymbolText> {
        let end = start.checked_add(len)?;
        self.0.text().get(start as usize..end as usize)?;
        Some(SymbolText {
            table: self.0.clone(),
            start,
            end,
            slot: NOT_DEMANGLED,
        })
    }

    /// The demangled form of the mangled name at `start..start + len`, made when first
    /// read and kept in slot `slot`; `None` if that range is not a whole run of
    /// characters of the strings, or the table has no such slot.
    pub(super) fn demangled_text(&self, start: u32, len: u32, slot: u32) -> Option<SymbolText> {
        if slot as usize >= self.0.demangled.len() {
            return None;
        }
        let text = self.text(start, len)?;
        Some(SymbolText { slot, ..text })
    }
}

/// The `slot` of a text that is its range as it is.
const NOT_DEMANGLED: u32 = u32::MAX;

/// An immutable string, usually a range of a module's [`StringTable`] (or the demangled
/// form of one, made when first read); reads as `str`.
#[derive(Clone)]
pub struct SymbolText {
    table: Arc<Table>,
    start: u32,
    end: u32,
    /// The table's slot for the demangled form of the range, or [`NOT_DEMANGLED`].
    slot: u32,
}

impl SymbolText {
    /// The text as a `str` (a name demangled when read is demangled now, once).
    pub fn as_str(&self) -> &str {
        match self.table.demangled.get(self.slot as usize) {
            Some(demangled) => demangled.get_or_init(|| demangle(self.range()).into()),
            None => self.range(),
        }
    }

    /// The mangled name this text is the demangled form of, if it is one (whether or
    /// not it has been demangled yet): what a search can test before demangling.
    pub fn mangled(&self) -> Option<&str> {
        (self.slot != NOT_DEMANGLED).then(|| self.range())
    }

    /// How many names of the table this text was cut from have been demangled.
    #[cfg(test)]
    pub(super) fn demangled_in_its_table(&self) -> usize {
        let demangled = self.table.demangled.iter();
        demangled.filter(|d| d.get().is_some()).count()
    }

    /// The range of the table this text was cut from.
    fn range(&self) -> &str {
        // In bounds and on character boundaries: checked when the handle was made.
        &self.table.text()[self.start as usize..self.end as usize]
    }
}

impl From<String> for SymbolText {
    fn from(text: String) -> SymbolText {
        // A name longer than 4 GiB is cut short (at a character) rather than refused.
        let mut len = text.len().min(u32::MAX as usize);
        while !text.is_char_boundary(len) {
            len -= 1;
        }
        StringTable::from_string(text, 0)
            .text(0, len as u32)
            .expect("a prefix of the table that ends at a character")
    }
}

impl From<&str> for SymbolText {
    fn from(text: &str) -> SymbolText {
        SymbolText::from(text.to_string())
    }
}

impl Deref for SymbolText {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for SymbolText {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for SymbolText {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for SymbolText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

impl fmt::Debug for SymbolText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq for SymbolText {
    fn eq(&self, other: &SymbolText) -> bool {
        // The same range of the same table (a name that needs no demangling is its own
        // raw name) is equal without comparing a byte.
        let same_range = Arc::ptr_eq(&self.table, &other.table)
            && (self.start, self.end, self.slot) == (other.start, other.end, other.slot);
        same_range || self.as_str() == other.as_str()
    }
}

impl Eq for SymbolText {}

impl PartialEq<str> for SymbolText {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for SymbolText {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for SymbolText {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<SymbolText> for str {
    fn eq(&self, other: &SymbolText) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<SymbolText> for String {
    fn eq(&self, other: &SymbolText) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<SymbolText> for &str {
    fn eq(&self, other: &SymbolText) -> bool {
        *self == other.as_str()
    }
}

impl PartialOrd for SymbolText {
    fn partial_cmp(&self, other: &SymbolText) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SymbolText {
    fn cmp(&self, other: &SymbolText) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for SymbolText {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl serde::Serialize for SymbolText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_ranges_of_one_table() {
        let table = StringTable::new(b"\0\0libc.so.6malloc".to_vec(), 2..17, 0).unwrap();
        let module = table.text(0, 9).unwrap();
        let name = table.text(9, 6).unwrap();
        assert_eq!(module, "libc.so.6");
        assert_eq!(name.as_str(), "malloc");
        assert_eq!(format!("{name} {name:?}"), "malloc \"malloc\"");
        assert_eq!(table.text(0, 0).unwrap(), "");
        assert!(table.text(10, 6).is_none(), "past the end");
        assert!(table.text(u32::MAX, 2).is_none(), "overflowing");
    }

    #[test]
    fn text_outside_utf8_or_the_buffer_is_refused() {
        assert!(StringTable::new(vec![0xff, b'a'], 0..2, 0).is_none());
        assert!(StringTable::new(vec![b'a'], 0..2, 0).is_none());
        let table = StringTable::new("é".as_bytes().to_vec(), 0..2, 0).unwrap();
        assert!(table.text(1, 1).is_none(), "inside a character");
        assert_eq!(table.text(0, 2).unwrap(), "é");
    }

    #[test]
    fn a_mangled_name_is_demangled_once_when_first_read() {
        let raw = "_ZN2ns3fooEi_ZN2ns3barEv";
        let table = StringTable::new(raw.as_bytes().to_vec(), 0..raw.len(), 2).unwrap();
        let foo = table.demangled_text(0, 12, 0).unwrap();
        let bar = table.demangled_text(12, 12, 1).unwrap();
        assert!(table.demangled_text(0, 12, 2).is_none(), "no such slot");
        assert_eq!(foo.mangled(), Some("_ZN2ns3fooEi"));
        assert_eq!(table.text(0, 12).unwrap().mangled(), None);
        assert_eq!(foo.demangled_in_its_table(), 0, "nothing read yet");
        assert_eq!(foo.as_str(), "ns::foo(int)");
        assert_eq!(bar.demangled_in_its_table(), 1, "only what was read");
        assert_eq!(foo.clone(), "ns::foo(int)");
        assert_ne!(foo, table.text(0, 12).unwrap(), "not its mangled form");
        assert_eq!(bar, SymbolText::from("ns::bar()"));
        assert_eq!(foo.demangled_in_its_table(), 2);
    }

    #[test]
    fn owned_text_compares_as_its_str() {
        let a = SymbolText::from("ns::foo(int)");
        assert_eq!(a, SymbolText::from("ns::foo(int)".to_string()));
        assert_eq!(a, "ns::foo(int)");
        assert_eq!("ns::foo(int)", a);
        assert_eq!("ns::foo(int)".to_string(), a);
        assert!(a.starts_with("ns::"));
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"ns::foo(int)\"");
    }
}
