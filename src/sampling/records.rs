//! The perf records tendril asks for, parsed from their bytes.
//!
//! The one idea: every event is opened with the same `sample_type`
//! ([`super::perf::SAMPLE_TYPE`]), so a sample record has one fixed layout —
//! identifier, pid and tid, time, the user registers' ABI and values, the user stack's
//! copy and how much of it is valid — and the `sample_id_all` trailer of every other
//! record is pid and tid, time, identifier. Nothing here allocates: a [`Sample`]
//! borrows the stack bytes from the ring.

use perf_event_open_sys::bindings as perf;

use super::perf::REGS_COUNT;

/// A sample: where a thread was, and the top of its stack.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    /// The event that took it (`PerfEvent::id`).
    pub event_id: u64,
    pub tid: u32,
    /// `CLOCK_MONOTONIC`-like perf clock, in ns.
    pub time_ns: u64,
    /// None when the thread had no user registers (a kernel thread, or a sample taken
    /// while the thread was exiting).
    pub regs: Option<UserRegs>,
    /// The copy of the stack from `regs.sp` up (only the valid part).
    pub stack: &'a [u8],
}

/// The registers an unwinder needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// A record this sampler understands.
#[derive(Debug, Clone, Copy)]
pub enum Record<'a> {
    Sample(Sample<'a>),
    /// The kernel dropped this many samples: the ring was full.
    Lost {
        count: u64,
    },
    /// A thread was switched in or out.
    Switch(Switch),
    /// Throttling, mmap, comm and other records: not used.
    Other,
}

/// A thread switched in (`out == false`) or out, at `time_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switch {
    /// The thread's process (thread group), as the kernel gives it.
    pub pid: u32,
    pub tid: u32,
    /// `CLOCK_MONOTONIC`, in ns.
    pub time_ns: u64,
    pub out: bool,
    /// Switched out while still runnable: it was preempted, and waits for a core.
    pub preempted: bool,
    /// The core it was switched out of or into ([`parse_switch_records`] only).
    pub cpu: Option<u32>,
}

/// Reads little pieces of a record front to back.
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn u64(&mut self) -> Option<u64> {
        let (head, rest) = self.bytes.split_first_chunk::<8>()?;
        self.bytes = rest;
        Some(u64::from_ne_bytes(*head))
    }

    fn u32_pair(&mut self) -> Option<(u32, u32)> {
        let (head, rest) = self.bytes.split_first_chunk::<8>()?;
        self.bytes = rest;
        let first = u32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
        let second = u32::from_ne_bytes([head[4], head[5], head[6], head[7]]);
        Some((first, second))
    }

    fn bytes(&mut self, len: usize) -> Option<&'a [u8]> {
        if len > self.bytes.len() {
            return None;
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Some(head)
    }
}

/// Parses one record (header included) of an event opened with [`super::perf::SAMPLE_TYPE`].
/// A record too short for its type is `Other`.
pub fn parse(record: &[u8]) -> Record<'_> {
    parse_checked(record, false).unwrap_or(Record::Other)
}

/// Parses one record of an event opened by `PerfEvent::open_switch_records`, whose
/// `sample_id_all` trailer is pid and tid, time, CPU: its switches say which core. A
/// core's record (`PERF_RECORD_SWITCH_CPU_WIDE`) is the switched thread's, as a
/// thread's own.
pub fn parse_switch_records(record: &[u8]) -> Record<'_> {
    parse_checked(record, true).unwrap_or(Record::Other)
}

fn parse_checked(record: &[u8], trailer_has_cpu: bool) -> Option<Record<'_>> {
    let (header, body) = record.split_first_chunk::<8>()?;
    let kind = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]);
    let misc = u16::from_ne_bytes([header[4], header[5]]);
    let mut cursor = Cursor { bytes: body };
    match kind {
        perf::PERF_RECORD_SAMPLE => {
            let event_id = cursor.u64()?;
            let (_pid, tid) = cursor.u32_pair()?;
            let time_ns = cursor.u64()?;
            let abi = cursor.u64()?;
            let regs = if abi == 0 {
                None
            } else {
                let mut values = [0u64; REGS_COUNT];
                for value in &mut values {
                    *value = cursor.u64()?;
                }
                // perf_regs order (ascending bit): BP, SP, IP.
                Some(UserRegs {
                    bp: values[0],
                    sp: values[1],
                    ip: values[2],
                })
            };
            let size = cursor.u64()? as usize;
            let stack = if size == 0 {
                &[][..]
            } else {
                let copied = cursor.bytes(size)?;
                let valid = cursor.u64()? as usize;
                &copied[..valid.min(size)]
            };
            Some(Record::Sample(Sample {
                event_id,
                tid,
                time_ns,
                regs,
                stack,
            }))
        }
        perf::PERF_RECORD_LOST => {
            let _id = cursor.u64()?;
            Some(Record::Lost {
                count: cursor.u64()?,
            })
        }
        perf::PERF_RECORD_SWITCH | perf::PERF_RECORD_SWITCH_CPU_WIDE => {
            if kind == perf::PERF_RECORD_SWITCH_CPU_WIDE {
                // The thread switched to or from: the trailer names the one switched.
                let _next_or_previous = cursor.u32_pair()?;
            }
            let (pid, tid) = cursor.u32_pair()?;
            let time_ns = cursor.u64()?;
            let cpu = match trailer_has_cpu {
                true => Some(cursor.u32_pair()?.0),
                false => None,
            };
            Some(Record::Switch(Switch {
                pid,
                tid,
                time_ns,
                out: u32::from(misc) & perf::PERF_RECORD_MISC_SWITCH_OUT != 0,
                preempted: u32::from(misc) & perf::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT != 0,
                cpu,
            }))
        }
        _ => Some(Record::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, misc: u16, words: &[u64], tail: &[u8]) -> Vec<u8> {
        let len = 8 + words.len() * 8 + tail.len();
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(&misc.to_ne_bytes());
        bytes.extend_from_slice(&(len as u16).to_ne_bytes());
        for word in words {
            bytes.extend_from_slice(&word.to_ne_bytes());
        }
        bytes.extend_from_slice(tail);
        bytes
    }

    fn pid_tid(pid: u32, tid: u32) -> u64 {
        u64::from_ne_bytes(
            [pid.to_ne_bytes(), tid.to_ne_bytes()]
                .concat()
                .try_into()
                .unwrap(),
        )
    }

    #[test]
    fn a_sample_gives_its_registers_and_the_valid_part_of_the_stack() {
        let mut stack = vec![0u8; 32];
        stack[..8].copy_from_slice(&0x1234u64.to_ne_bytes());
        let mut tail = stack.clone();
        tail.extend_from_slice(&16u64.to_ne_bytes()); // dyn_size: 16 of 32 valid
        let bytes = record(
            perf::PERF_RECORD_SAMPLE,
            0,
            &[7, pid_tid(10, 11), 99, 2, 0xb0, 0x5a, 0x1f, 32],
            &tail,
        );
        let Record::Sample(sample) = parse(&bytes) else {
            panic!("not a sample")
        };
        assert_eq!(sample.event_id, 7);
        assert_eq!(sample.tid, 11);
        assert_eq!(sample.time_ns, 99);
        assert_eq!(
            sample.regs,
            Some(UserRegs {
                bp: 0xb0,
                sp: 0x5a,
                ip: 0x1f
            })
        );
        assert_eq!(sample.stack.len(), 16);
        assert_eq!(&sample.stack[..8], &0x1234u64.to_ne_bytes());
    }

    #[test]
    fn a_sample_without_user_registers_has_none() {
        let bytes = record(
            perf::PERF_RECORD_SAMPLE,
            0,
            &[1, pid_tid(1, 2), 3, 0, 0],
            &[],
        );
        let Record::Sample(sample) = parse(&bytes) else {
            panic!("not a sample")
        };
        assert_eq!(sample.regs, None);
        assert!(sample.stack.is_empty());
    }

    #[test]
    fn switches_lost_and_short_records() {
        let out = record(
            perf::PERF_RECORD_SWITCH,
            perf::PERF_RECORD_MISC_SWITCH_OUT as u16,
            &[pid_tid(5, 6), 42, 1],
            &[],
        );
        assert!(matches!(
            parse(&out),
            Record::Switch(Switch {
                pid: 5,
                tid: 6,
                time_ns: 42,
                out: true,
                preempted: false,
                cpu: None,
            })
        ));
        let lost = record(perf::PERF_RECORD_LOST, 0, &[1, 17], &[]);
        assert!(matches!(parse(&lost), Record::Lost { count: 17 }));
        let short = record(perf::PERF_RECORD_SAMPLE, 0, &[1], &[]);
        assert!(matches!(parse(&short), Record::Other));
    }

    #[test]
    fn a_switch_record_with_the_cpu_says_which_core_and_whether_preempted() {
        let misc = perf::PERF_RECORD_MISC_SWITCH_OUT | perf::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT;
        let preempted = record(
            perf::PERF_RECORD_SWITCH,
            misc as u16,
            &[pid_tid(5, 6), 42, 3],
            &[],
        );
        assert!(matches!(
            parse_switch_records(&preempted),
            Record::Switch(Switch {
                out: true,
                preempted: true,
                cpu: Some(3),
                ..
            })
        ));
        let back_in = record(perf::PERF_RECORD_SWITCH, 0, &[pid_tid(5, 6), 43, 1], &[]);
        assert!(matches!(
            parse_switch_records(&back_in),
            Record::Switch(Switch {
                out: false,
                preempted: false,
                cpu: Some(1),
                time_ns: 43,
                ..
            })
        ));
        let without_the_cpu = record(perf::PERF_RECORD_SWITCH, 0, &[pid_tid(5, 6), 43], &[]);
        assert!(matches!(
            parse_switch_records(&without_the_cpu),
            Record::Other
        ));
    }

    #[test]
    fn a_cores_switch_record_is_the_switched_threads() {
        // Thread 6 of process 5 switched out of core 2 for thread 9 of process 8.
        let out = record(
            perf::PERF_RECORD_SWITCH_CPU_WIDE,
            perf::PERF_RECORD_MISC_SWITCH_OUT as u16,
            &[pid_tid(8, 9), pid_tid(5, 6), 44, 2],
            &[],
        );
        assert!(matches!(
            parse_switch_records(&out),
            Record::Switch(Switch {
                pid: 5,
                tid: 6,
                time_ns: 44,
                out: true,
                cpu: Some(2),
                ..
            })
        ));
    }
}
