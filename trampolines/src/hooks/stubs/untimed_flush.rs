//! The recording hook writes the thread's untimed calls out itself, before its own
//! event, when they are what brought it to its ring's slow path.
//!
//! Adaptive timing counts untimed calls in a per-thread table
//! (`runtime::untimed_table`), and lowers the ring limit to 0 so that the thread's next
//! recording hook writes the counts as `Call` events before its timed event. That
//! writing took the slow path: a call into Rust behind a save of every register, the
//! vector ones included (`xsave`), which on CPython's json encoder — a timed frame after
//! every few untimed calls — was most of what a recording cost the target (issue 32,
//! BENCHMARKS.md). The one idea: the table is a few fixed-size slots and an order list,
//! and a `Call` event is two words, so a small routine of the agent's,
//! `tendril_write_untimed_calls`, writes them with general registers only, as a hook
//! writes its own event, whenever the ring's room (the limit the slow path last set,
//! kept in `ring_room_limit`) holds them all and the hook's event, and the counts are
//! this recording's. Anything else — no room, an in-situ batch due, a new recording —
//! goes to the slow path as before, which does the same in Rust.

use super::handlers;
use crate::hooks::thread_layout::{
    STATE_RING_EVENTS, STATE_RING_HEAD, STATE_RING_HEADER, STATE_RING_LIMIT, STATE_RING_MASK,
    STATE_RING_ROOM_LIMIT, STATE_UNTIMED_GENERATION, STATE_UNTIMED_ORDER, STATE_UNTIMED_SLOTS,
    STATE_UNTIMED_USED, UNTIMED_SLOT_COUNT, UNTIMED_SLOT_FUNCTION, UNTIMED_SLOT_RETURN_ADDRESS,
    UNTIMED_SLOT_SIZE, UNTIMED_SLOTS,
};
use iced_x86::code_asm::*;
use tendril_wire::events::{CALL_ADDRESS_BITS, CALL_ADDRESS_MASK, EventKind};

/// The second word of a `Call` event, without its function id.
const CALL_KIND_WORD: u64 = (EventKind::Call as u64) << 32;
const _: () = assert!(
    UNTIMED_SLOT_SIZE == 1 << 5,
    "the slot index is shifted by 5"
);

// tendril_write_untimed_calls: rcx the thread's state, r11 its ring head, rdx the
// address of the recording's generation word. Writes the untimed calls as `Call`
// events, then answers rdx = 0 with the new head in r11 and the ring limit restored;
// or, when it cannot, answers rdx = 1 with nothing changed. Keeps every register but
// rdx and the flags (rax holds an exit's timestamp).
core::arch::global_asm!(
    ".pushsection .text.tendril_write_untimed_calls,\"ax\",@progbits",
    ".balign 16",
    ".globl tendril_write_untimed_calls",
    ".hidden tendril_write_untimed_calls",
    ".type tendril_write_untimed_calls, @function",
    "tendril_write_untimed_calls:",
    ".cfi_startproc",
    "mov rdx, qword ptr [rdx]",
    "cmp qword ptr [rcx + {used}], 0",
    "je 9f",
    "cmp qword ptr [rcx + {used}], {slots}",
    "ja 9f",
    "cmp rdx, qword ptr [rcx + {generation}]",
    "jne 9f",
    // Room for every listed pair and the hook's own event (a pair whose count is 0
    // writes nothing: this may ask for more than is written).
    "mov rdx, qword ptr [rcx + {used}]",
    "lea rdx, [r11 + rdx + 1]",
    "cmp rdx, qword ptr [rcx + {room_limit}]",
    "ja 9f",
    "push rax", ".cfi_adjust_cfa_offset 8",
    "push rsi", ".cfi_adjust_cfa_offset 8",
    "push rdi", ".cfi_adjust_cfa_offset 8",
    "push r8", ".cfi_adjust_cfa_offset 8",
    "xor esi, esi",
    "2:",
    // rdi: the slot listed at index rsi.
    "mov rdi, qword ptr [rcx + rsi * 8 + {order}]",
    "and edi, {slot_mask}",
    "shl edi, 5",
    "lea rdi, [rcx + rdi + {slots_base}]",
    "mov r8, qword ptr [rdi + {count}]",
    "test r8, r8",
    "jz 3f",
    // The pair stays, its count back to 0 (the untimed hook lists it again).
    "mov qword ptr [rdi + {count}], 0",
    // The value: the return address, and the count less one above it.
    "dec r8",
    "shl r8, {address_bits}",
    "movabs rax, {address_mask}",
    "and rax, qword ptr [rdi + {return_address}]",
    "or r8, rax",
    // The event's slot in the ring, as the hooks find it.
    "mov rdx, r11",
    "and rdx, qword ptr [rcx + {ring_mask}]",
    "shl rdx, 4",
    "add rdx, qword ptr [rcx + {ring_events}]",
    "mov qword ptr [rdx], r8",
    "mov r8d, dword ptr [rdi + {function}]",
    "movabs rax, {kind_word}",
    "or r8, rax",
    "mov qword ptr [rdx + 8], r8",
    "inc r11",
    "3:",
    "inc rsi",
    "cmp rsi, qword ptr [rcx + {used}]",
    "jb 2b",
    "mov qword ptr [rcx + {used}], 0",
    // Published as one head, after the events.
    "mov qword ptr [rcx + {head}], r11",
    "mov rdx, qword ptr [rcx + {header}]",
    "mov qword ptr [rdx + {header_head}], r11",
    "mov rdx, qword ptr [rcx + {room_limit}]",
    "mov qword ptr [rcx + {limit}], rdx",
    "pop r8", ".cfi_adjust_cfa_offset -8",
    "pop rdi", ".cfi_adjust_cfa_offset -8",
    "pop rsi", ".cfi_adjust_cfa_offset -8",
    "pop rax", ".cfi_adjust_cfa_offset -8",
    "xor edx, edx",
    "ret",
    "9:",
    "mov edx, 1",
    "ret",
    ".cfi_endproc",
    ".size tendril_write_untimed_calls, . - tendril_write_untimed_calls",
    ".popsection",
    used = const STATE_UNTIMED_USED,
    slots = const UNTIMED_SLOTS,
    generation = const STATE_UNTIMED_GENERATION,
    room_limit = const STATE_RING_ROOM_LIMIT,
    order = const STATE_UNTIMED_ORDER,
    slot_mask = const UNTIMED_SLOTS - 1,
    slots_base = const STATE_UNTIMED_SLOTS,
    count = const UNTIMED_SLOT_COUNT,
    address_bits = const CALL_ADDRESS_BITS,
    address_mask = const CALL_ADDRESS_MASK,
    return_address = const UNTIMED_SLOT_RETURN_ADDRESS,
    ring_mask = const STATE_RING_MASK,
    ring_events = const STATE_RING_EVENTS,
    function = const UNTIMED_SLOT_FUNCTION,
    kind_word = const CALL_KIND_WORD,
    head = const STATE_RING_HEAD,
    header = const STATE_RING_HEADER,
    header_head = const tendril_wire::rings::ring::HEAD,
    limit = const STATE_RING_LIMIT,
);

unsafe extern "C" {
    fn tendril_write_untimed_calls();
}

/// At a recording hook's ring slow path (`rcx` the thread's state, `r11` its ring head,
/// `rax` kept): has `tendril_write_untimed_calls` write the thread's untimed calls and
/// jumps to `room` if it did; else goes on to the code that follows (the slow path),
/// with r11 and rax as they were. `routine` is the data word holding the routine's
/// address ([`routine_word`]). Clobbers rdx and the flags (the hook keeps its caller's
/// flags in r10).
pub(super) fn write_untimed_calls(
    a: &mut CodeAssembler,
    routine: CodeLabel,
    room: CodeLabel,
) -> Result<(), IcedError> {
    a.mov(rdx, (handlers().generation_word)())?;
    a.call(qword_ptr(routine))?;
    a.test(edx, edx)?;
    a.jz(room)
}

/// The data word holding `tendril_write_untimed_calls`'s address (it may be far away).
pub(super) fn routine_word(a: &mut CodeAssembler, label: &mut CodeLabel) -> Result<(), IcedError> {
    a.set_label(label)?;
    a.dq(&[tendril_write_untimed_calls as *const () as u64])
}
