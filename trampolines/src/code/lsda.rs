//! A function's exception tables (its LSDA, in `.gcc_except_table`), read and rewritten
//! for its copy (issue 18), so that an exception thrown while a thread runs the copy
//! finds the same handlers and cleanups as in the original.
//!
//! The one idea: an LSDA holds addresses only in its call-site table (code ranges and
//! landing pads, as offsets from the function) and in its type table (pointers to
//! `type_info`s, often relative to the entry's own place); its action table and
//! exception specifications refer to the type table by index. A landing pad compares
//! the filter the personality hands it (in `rdx`) with numbers compiled into it, so
//! every filter keeps its value: the copy's LSDA keeps the type indices and the
//! specification bytes as they are (parts of one function share them), re-encodes every
//! type entry as an absolute pointer, writes the action records again, and rebuilds
//! the call-site table: each original range becomes the
//! copy's pieces of the instructions in it, each landing pad inside the function the
//! copy's block there (a landing pad outside it, in a `.cold` part, stays where it is).
//! The rest of the format is the GCC/libgcc one (`unwind-pe.h`, `eh_personality.cc`):
//! `LPStart` omitted means the function's start, call sites are relative to it too.

use std::fmt;

/// `DW_EH_PE_*` values this module reads and writes.
const OMIT: u8 = 0xff;
const ABSPTR: u8 = 0x00;
const ULEB128: u8 = 0x01;
const UDATA2: u8 = 0x02;
const UDATA4: u8 = 0x03;
const UDATA8: u8 = 0x04;
const SLEB128: u8 = 0x09;
const SDATA2: u8 = 0x0a;
const SDATA4: u8 = 0x0b;
const SDATA8: u8 = 0x0c;
const PCREL: u8 = 0x10;
const INDIRECT: u8 = 0x80;

/// One call-site record, in absolute addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallSite {
    /// The code it covers: `start..end`.
    pub start: u64,
    pub end: u64,
    /// Where an exception thrown there lands; `None`: it passes through.
    pub landing_pad: Option<u64>,
    /// 1 + the offset of its first action record; 0: cleanup only.
    pub action: u64,
}

/// A parsed LSDA, its action records by index, so that the LSDAs of several parts of a
/// function can become one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lsda {
    /// Their `action`: 0 for none, else 1 + an index into `actions`.
    pub call_sites: Vec<CallSite>,
    actions: Vec<Action>,
    /// Type entries 1..=N as absolute pointer values (0: catch everything); `None`
    /// without a type table.
    types: Option<Vec<u64>>,
    /// Whether type entries point at the `type_info` pointer rather than at it.
    indirect_types: bool,
    /// The exception specifications' bytes, from the type table's base to the end of
    /// the last one a filter names (lists of type indices, each ended by 0).
    specifications: Vec<u8>,
}

/// One action record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Action {
    filter: Filter,
    /// The next record's index.
    next: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Filter {
    Cleanup,
    /// Catches type entry `n` (1-based).
    Catch(u64),
    /// Allows only the types of the specification `n` bytes past the type table's base
    /// (the filter `-n - 1`).
    Allows(usize),
}

/// Why an LSDA cannot be moved to a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LsdaRefusal {
    /// It ends early or says something impossible.
    Malformed(&'static str),
    /// A pointer encoding tendril does not read there.
    Encoding(u8),
    /// Two parts of the function whose tables disagree.
    Mismatch(&'static str),
}

impl fmt::Display for LsdaRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(why) => write!(f, "its exception table is malformed ({why})"),
            Self::Encoding(encoding) => write!(
                f,
                "its exception table uses pointer encoding {encoding:#04x}, which tendril \
                 does not read"
            ),
            Self::Mismatch(why) => write!(f, "its parts' exception tables differ ({why})"),
        }
    }
}

/// Bytes being read, with their address.
struct Cursor<'a> {
    bytes: &'a [u8],
    address: u64,
    at: usize,
}

impl Cursor<'_> {
    fn u8(&mut self) -> Result<u8, LsdaRefusal> {
        let byte = *self.bytes.get(self.at).ok_or(SHORT)?;
        self.at += 1;
        Ok(byte)
    }

    fn fixed(&mut self, size: usize) -> Result<u64, LsdaRefusal> {
        let bytes = self.bytes.get(self.at..self.at + size).ok_or(SHORT)?;
        self.at += size;
        let mut word = [0u8; 8];
        word[..size].copy_from_slice(bytes);
        Ok(u64::from_le_bytes(word))
    }

    fn uleb(&mut self) -> Result<u64, LsdaRefusal> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(LsdaRefusal::Malformed("a number longer than 64 bits"))
    }

    fn sleb(&mut self) -> Result<i64, LsdaRefusal> {
        let mut value = 0i64;
        let mut shift = 0;
        loop {
            let byte = self.u8()?;
            if shift < 64 {
                value |= i64::from(byte & 0x7f) << shift;
            }
            shift += 7;
            if byte & 0x80 == 0 {
                if shift < 64 && byte & 0x40 != 0 {
                    value |= -1i64 << shift;
                }
                return Ok(value);
            }
        }
    }

    /// A value in `encoding`'s format, with its application (absolute or relative to
    /// the field's address) applied; 0 stays 0, as libgcc reads it.
    fn encoded(&mut self, encoding: u8) -> Result<u64, LsdaRefusal> {
        let field = self.address.wrapping_add(self.at as u64);
        let raw = match encoding & 0x0f {
            ABSPTR | UDATA8 => self.fixed(8)?,
            ULEB128 => self.uleb()?,
            UDATA2 => self.fixed(2)?,
            UDATA4 => self.fixed(4)?,
            SLEB128 => self.sleb()? as u64,
            SDATA2 => self.fixed(2)? as i16 as u64,
            SDATA4 => self.fixed(4)? as i32 as u64,
            SDATA8 => self.fixed(8)?,
            _ => return Err(LsdaRefusal::Encoding(encoding)),
        };
        match encoding & 0x70 {
            _ if raw == 0 => Ok(0),
            0 => Ok(raw),
            PCREL => Ok(field.wrapping_add(raw)),
            _ => Err(LsdaRefusal::Encoding(encoding)),
        }
    }
}

const SHORT: LsdaRefusal = LsdaRefusal::Malformed("it ends early");
/// Most action records and specifications read from one LSDA.
const MOST_RECORDS: usize = 1 << 16;

/// Bytes of one type entry in `encoding` (a fixed size: libgcc indexes the table).
fn entry_size(encoding: u8) -> Result<usize, LsdaRefusal> {
    match encoding & 0x0f {
        ABSPTR | UDATA8 | SDATA8 => Ok(8),
        UDATA4 | SDATA4 => Ok(4),
        UDATA2 | SDATA2 => Ok(2),
        _ => Err(LsdaRefusal::Encoding(encoding)),
    }
}

impl Lsda {
    /// The LSDA at `address` (`bytes` from there on: at least the whole of it) of the
    /// code whose FDE starts at `function`.
    pub fn parse(bytes: &[u8], address: u64, function: u64) -> Result<Lsda, LsdaRefusal> {
        let mut cursor = Cursor {
            bytes,
            address,
            at: 0,
        };
        let start_encoding = cursor.u8()?;
        let landing_pad_base = match start_encoding {
            OMIT => function,
            encoding => cursor.encoded(encoding)?,
        };
        let type_encoding = cursor.u8()?;
        let type_base = match type_encoding {
            OMIT => None,
            _ => {
                let offset = cursor.uleb()? as usize;
                Some(cursor.at.checked_add(offset).ok_or(SHORT)?)
            }
        };
        let site_encoding = cursor.u8()?;
        if site_encoding & 0xf0 != 0 {
            return Err(LsdaRefusal::Encoding(site_encoding));
        }
        let sites_length = cursor.uleb()? as usize;
        let sites_end = cursor.at.checked_add(sites_length).ok_or(SHORT)?;
        let mut call_sites = Vec::new();
        while cursor.at < sites_end {
            let start = function.wrapping_add(cursor.encoded(site_encoding)?);
            let length = cursor.encoded(site_encoding)?;
            let pad = cursor.encoded(site_encoding)?;
            let action = cursor.uleb()?;
            call_sites.push(CallSite {
                start,
                end: start.wrapping_add(length),
                landing_pad: (pad != 0).then(|| landing_pad_base.wrapping_add(pad)),
                action,
            });
        }
        if cursor.at != sites_end {
            return Err(LsdaRefusal::Malformed("its call sites overrun their table"));
        }
        let mut reader = Records {
            cursor,
            actions_start: sites_end,
            type_base,
            by_offset: Vec::new(),
            actions: Vec::new(),
            specifications_end: None,
            largest_in_specifications: 0,
        };
        for site in &mut call_sites {
            if site.action != 0 {
                let offset = usize::try_from(site.action - 1)
                    .ok()
                    .and_then(|offset| sites_end.checked_add(offset))
                    .ok_or(LsdaRefusal::Malformed("an action outside its table"))?;
                site.action = 1 + reader.action_at(offset)? as u64;
            }
        }
        let largest_type = (reader.actions.iter())
            .filter_map(|action| match action.filter {
                Filter::Catch(n) => Some(n),
                _ => None,
            })
            .max()
            .unwrap_or(0)
            .max(reader.largest_in_specifications);
        let types = match type_base {
            None if largest_type > 0 => {
                return Err(LsdaRefusal::Malformed("a filter without a type table"));
            }
            None => None,
            Some(base) => {
                let size = entry_size(type_encoding)?;
                let mut types = Vec::new();
                if largest_type > MOST_RECORDS as u64 {
                    return Err(LsdaRefusal::Malformed("a type index past any table"));
                }
                for index in 1..=largest_type as usize {
                    reader.cursor.at = base.checked_sub(index * size).ok_or(SHORT)?;
                    types.push(reader.cursor.encoded(type_encoding & !INDIRECT)?);
                }
                Some(types)
            }
        };
        let specifications = match (type_base, reader.specifications_end) {
            (Some(base), Some(end)) => bytes.get(base..end).ok_or(SHORT)?.to_vec(),
            _ => Vec::new(),
        };
        Ok(Lsda {
            call_sites,
            actions: reader.actions,
            types,
            indirect_types: type_encoding != OMIT && type_encoding & INDIRECT != 0,
            specifications,
        })
    }

    /// The LSDAs of a function's parts (its main part's and its `.cold` parts') as one.
    /// GCC gives the parts the same types and specifications (only their call sites
    /// differ), and their landing pads compare filters with those numbers: they must
    /// agree (one may stop short of the other), and keep their values.
    pub fn join(parts: Vec<Lsda>) -> Result<Lsda, LsdaRefusal> {
        let mut parts = parts.into_iter();
        let Some(mut joined) = parts.next() else {
            return Err(LsdaRefusal::Malformed("no table"));
        };
        for part in parts {
            let typed = |lsda: &Lsda| lsda.types.as_ref().is_some_and(|t| !t.is_empty());
            if typed(&joined) && typed(&part) && joined.indirect_types != part.indirect_types {
                return Err(LsdaRefusal::Mismatch(
                    "their type entries are read differently",
                ));
            }
            if typed(&part) {
                joined.indirect_types = part.indirect_types;
            }
            joined.types = match (joined.types.take(), part.types) {
                (Some(a), Some(b)) => Some(longer_agreeing(a, b, "their type tables")?),
                (a, b) => a.or(b),
            };
            joined.specifications = longer_agreeing(
                std::mem::take(&mut joined.specifications),
                part.specifications,
                "their exception specifications",
            )?;
            let action_base = joined.actions.len();
            joined
                .actions
                .extend(part.actions.into_iter().map(|action| Action {
                    next: action.next.map(|next| next + action_base),
                    ..action
                }));
            joined
                .call_sites
                .extend(part.call_sites.into_iter().map(|site| CallSite {
                    action: match site.action {
                        0 => 0,
                        action => action + action_base as u64,
                    },
                    ..site
                }));
        }
        Ok(joined)
    }

    /// The landing pads in any of `ranges`.
    pub fn landing_pads_in(&self, ranges: &[(u64, u64)]) -> Vec<u64> {
        let mut pads: Vec<u64> = (self.call_sites.iter())
            .filter_map(|site| site.landing_pad)
            .filter(|&pad| {
                ranges
                    .iter()
                    .any(|&(start, end)| (start..end).contains(&pad))
            })
            .collect();
        pads.sort_unstable();
        pads.dedup();
        pads
    }

    /// The LSDA of the copy starting at `copy_start`: `pieces(start, end)` gives the
    /// copy's ranges of the original instructions in `start..end`, and `moved(pad)`
    /// where a landing pad is in the copy (a pad outside the function: itself).
    pub fn for_copy(
        &self,
        copy_start: u64,
        pieces: &dyn Fn(u64, u64) -> Vec<(u64, u64)>,
        moved: &dyn Fn(u64) -> u64,
    ) -> Vec<u8> {
        let mut sites: Vec<CallSite> = Vec::new();
        for site in &self.call_sites {
            for (start, end) in pieces(site.start, site.end) {
                sites.push(CallSite {
                    start,
                    end,
                    landing_pad: site.landing_pad.map(moved),
                    action: site.action,
                });
            }
        }
        // The personality stops at the first site past the pc: sorted, and merged where
        // one piece goes on where the last ended.
        sites.sort_by_key(|site| site.start);
        let mut merged: Vec<CallSite> = Vec::new();
        for site in sites {
            match merged.last_mut() {
                Some(last)
                    if last.end == site.start
                        && (last.landing_pad, last.action) == (site.landing_pad, site.action) =>
                {
                    last.end = site.end;
                }
                _ => merged.push(site),
            }
        }
        // Action records of a fixed size, so that every displacement is known before
        // it is written: each number in a padded 4-byte SLEB128.
        let mut actions = Vec::new();
        for (index, action) in self.actions.iter().enumerate() {
            let filter = match action.filter {
                Filter::Cleanup => 0,
                Filter::Catch(n) => n as i64,
                Filter::Allows(offset) => -(offset as i64) - 1,
            };
            let displacement = action.next.map_or(0, |next| {
                (ACTION_BYTES * next) as i64 - (ACTION_BYTES * index + 4) as i64
            });
            write_padded_sleb(&mut actions, filter);
            write_padded_sleb(&mut actions, displacement);
        }
        // Call sites in 8-byte offsets from the copy's start (LPStart omitted), which
        // reach a landing pad below it too (modulo 2^64, as libgcc adds them).
        let mut table = Vec::new();
        for site in &merged {
            table.extend_from_slice(&site.start.wrapping_sub(copy_start).to_le_bytes());
            table.extend_from_slice(&(site.end - site.start).to_le_bytes());
            let pad = site
                .landing_pad
                .map_or(0, |pad| pad.wrapping_sub(copy_start));
            table.extend_from_slice(&pad.to_le_bytes());
            let action = match site.action {
                0 => 0,
                action => 1 + ACTION_BYTES as u64 * (action - 1),
            };
            write_uleb(&mut table, action);
        }
        let mut after_type_offset = vec![UDATA8];
        write_uleb(&mut after_type_offset, table.len() as u64);
        after_type_offset.extend_from_slice(&table);
        after_type_offset.extend_from_slice(&actions);
        let mut lsda = vec![OMIT];
        match &self.types {
            None => {
                lsda.push(OMIT);
                lsda.extend_from_slice(&after_type_offset);
            }
            Some(types) => {
                lsda.push(ABSPTR | if self.indirect_types { INDIRECT } else { 0 });
                for pointer in types.iter().rev() {
                    after_type_offset.extend_from_slice(&pointer.to_le_bytes());
                }
                write_uleb(&mut lsda, after_type_offset.len() as u64);
                lsda.extend_from_slice(&after_type_offset);
                lsda.extend_from_slice(&self.specifications);
            }
        }
        lsda
    }
}

/// Bytes of one action record the copy's LSDA writes.
const ACTION_BYTES: usize = 8;

/// The action records and specifications of one LSDA, read as call sites reach them.
struct Records<'a> {
    cursor: Cursor<'a>,
    actions_start: usize,
    type_base: Option<usize>,
    /// (byte offset, index) of the records read.
    by_offset: Vec<(usize, usize)>,
    actions: Vec<Action>,
    /// Where the specifications the filters name end (from the LSDA's start), and the
    /// largest type index they hold.
    specifications_end: Option<usize>,
    largest_in_specifications: u64,
}

impl Records<'_> {
    /// The index of the record at byte `offset`, read with the chain it leads to.
    fn action_at(&mut self, offset: usize) -> Result<usize, LsdaRefusal> {
        let mut head = None;
        let mut previous: Option<usize> = None;
        let mut at = offset;
        loop {
            let known = self
                .by_offset
                .iter()
                .find(|(o, _)| *o == at)
                .map(|&(_, i)| i);
            let index = match known {
                Some(index) => index,
                None if self.actions.len() >= MOST_RECORDS => {
                    return Err(LsdaRefusal::Malformed("too many action records"));
                }
                None => {
                    self.by_offset.push((at, self.actions.len()));
                    self.actions.push(Action {
                        filter: Filter::Cleanup,
                        next: None,
                    });
                    self.actions.len() - 1
                }
            };
            if let Some(previous) = previous {
                self.actions[previous].next = Some(index);
            }
            let head = *head.get_or_insert(index);
            if known.is_some() {
                return Ok(head);
            }
            self.cursor.at = at;
            let filter = self.cursor.sleb()?;
            let displacement_at = self.cursor.at;
            let displacement = self.cursor.sleb()?;
            self.actions[index].filter = match filter {
                0 => Filter::Cleanup,
                n if n > 0 => Filter::Catch(n as u64),
                n => Filter::Allows(self.specification_at(!n as usize)?),
            };
            if displacement == 0 {
                return Ok(head);
            }
            at = (displacement_at as i64)
                .checked_add(displacement)
                .and_then(|at| usize::try_from(at).ok())
                .filter(|&at| at >= self.actions_start)
                .ok_or(LsdaRefusal::Malformed("an action record outside its table"))?;
            previous = Some(index);
        }
    }

    /// Reads the specification `offset` bytes past the type table's base (a list of
    /// type indices ended by 0), noting where it ends; returns `offset`.
    fn specification_at(&mut self, offset: usize) -> Result<usize, LsdaRefusal> {
        let base = self.type_base.ok_or(LsdaRefusal::Malformed(
            "a specification without a type table",
        ))?;
        self.cursor.at = base.checked_add(offset).ok_or(SHORT)?;
        for _ in 0..MOST_RECORDS {
            match self.cursor.uleb()? {
                0 => {
                    let end = self.specifications_end.get_or_insert(self.cursor.at);
                    *end = (*end).max(self.cursor.at);
                    return Ok(offset);
                }
                index => self.largest_in_specifications = self.largest_in_specifications.max(index),
            }
        }
        Err(LsdaRefusal::Malformed("an endless specification"))
    }
}

/// `a` or `b`, whichever is longer, if the shorter is the start of the longer.
fn longer_agreeing<T: PartialEq>(
    a: Vec<T>,
    b: Vec<T>,
    what: &'static str,
) -> Result<Vec<T>, LsdaRefusal> {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    if long[..short.len()] != short[..] {
        return Err(LsdaRefusal::Mismatch(what));
    }
    Ok(long)
}

/// `value` as SLEB128 in exactly 4 bytes (continuation bits on the first three); it
/// must lie within ±2^27, as every value an LSDA of under 128 MiB holds does.
fn write_padded_sleb(out: &mut Vec<u8>, value: i64) {
    let bits = value as u64;
    for byte in 0..4 {
        let seven = ((bits >> (7 * byte)) & 0x7f) as u8;
        out.push(if byte < 3 { seven | 0x80 } else { seven });
    }
}

fn write_uleb(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests;
