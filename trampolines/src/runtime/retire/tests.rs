//! The retire pass's decisions, without a live target: which slots get their real
//! return address back, which entries still keep an exit, which registrations a pass
//! looks at, and what the threads' positions say of the pass.

use super::*;
use std::cell::RefCell;
use std::collections::HashMap;

/// Stack words in a map; an address not in it is unmapped.
#[derive(Default)]
struct FakeStacks(RefCell<HashMap<u64, u64>>);

impl FakeStacks {
    fn with(words: &[(u64, u64)]) -> FakeStacks {
        FakeStacks(RefCell::new(words.iter().copied().collect()))
    }

    fn word(&self, address: u64) -> Option<u64> {
        self.0.borrow().get(&address).copied()
    }
}

impl StackWords for FakeStacks {
    fn read(&self, address: u64) -> Option<u64> {
        self.word(address)
    }

    fn replace(&self, address: u64, current: u64, new: u64) {
        let mut words = self.0.borrow_mut();
        if let Some(word) = words.get_mut(&address)
            && *word == current
        {
            *word = new;
        }
    }
}

const EXIT: u64 = 0x7000_0000;

fn entry(slot: u64, return_address: u64, exit: u64) -> ShadowEntry {
    ShadowEntry {
        slot,
        return_address,
        function: 3,
        exit,
    }
}

/// Runs a pass over `entries` (oldest first), as `retire_entries` does: from the top.
fn retire_all(entries: &[ShadowEntry], stacks: &FakeStacks) {
    for &entry in entries.iter().rev() {
        retire_entry(entry, stacks);
    }
}

#[test]
fn a_slot_holding_its_exit_gets_the_real_address_back() {
    let stacks = FakeStacks::with(&[(0x100, EXIT), (0x200, EXIT + 16)]);
    retire_all(
        &[entry(0x200, 0x4010, EXIT + 16), entry(0x100, 0x4020, EXIT)],
        &stacks,
    );
    assert_eq!(stacks.word(0x100), Some(0x4020));
    assert_eq!(stacks.word(0x200), Some(0x4010));
}

#[test]
fn a_slot_that_changed_is_left_alone() {
    // The frame returned and the slot now holds something else (a new frame's data,
    // or the real address an unwinder put back).
    let stacks = FakeStacks::with(&[(0x100, 0xdead)]);
    retire_all(&[entry(0x100, 0x4020, EXIT)], &stacks);
    assert_eq!(stacks.word(0x100), Some(0xdead));
}

#[test]
fn an_unmapped_slot_is_skipped() {
    let stacks = FakeStacks::default();
    retire_all(&[entry(0x100, 0x4020, EXIT)], &stacks);
    assert_eq!(
        stacks.word(0x100),
        None,
        "nothing is written where nothing is mapped"
    );
}

#[test]
fn the_newest_entry_for_a_slot_claims_it() {
    // Two entries name one slot: the older frame returned and a new call reused the
    // slot, with another trampoline's exit. The newest entry's address goes back; the
    // older entry then finds its exit gone and leaves the slot alone.
    let older = entry(0x100, 0x4020, EXIT);
    let newer = entry(0x100, 0x5030, EXIT + 32);
    let stacks = FakeStacks::with(&[(0x100, EXIT + 32)]);
    retire_all(&[older, newer], &stacks);
    assert_eq!(stacks.word(0x100), Some(0x5030));
}

#[test]
fn an_entry_keeps_an_exit_while_its_slot_holds_it_or_a_hook_may_put_it_back() {
    let live = entry(0x100, 0x4020, EXIT);
    let holding = FakeStacks::with(&[(0x100, EXIT)]);
    let put_back = FakeStacks::with(&[(0x100, 0x4020)]);
    assert!(entry_holds_an_exit(live, 3, &holding));
    assert!(!entry_holds_an_exit(live, 3, &put_back));
    // Put back for an unwinder and not retired: the next hook re-installs the exit.
    assert!(entry_holds_an_exit(live, 3 | ENTRY_RESTORED, &put_back));
    // Retired: nothing puts it back.
    let retired = 3 | ENTRY_RESTORED | ENTRY_RETIRED;
    assert!(!entry_holds_an_exit(live, retired, &put_back));
    // A slot that is gone holds nothing.
    assert!(!entry_holds_an_exit(live, 3, &FakeStacks::default()));
}

#[test]
fn a_pass_then_finds_no_exit_left() {
    let entries = [
        entry(0x100, 0x4020, EXIT),
        entry(0x180, 0x4030, EXIT + 16),
        entry(0x100, 0x5030, EXIT + 32),
    ];
    let stacks = FakeStacks::with(&[(0x100, EXIT + 32), (0x180, EXIT + 16)]);
    assert!(entries.iter().any(|&e| entry_holds_an_exit(e, 3, &stacks)));
    retire_all(&entries, &stacks);
    let retired = 3 | ENTRY_RETIRED;
    assert!(
        !entries
            .iter()
            .any(|&e| entry_holds_an_exit(e, retired, &stacks))
    );
}

#[test]
fn the_pass_looks_at_the_newest_registration_of_each_live_target_thread() {
    // (tid, is_agent), oldest first: thread 10 registered twice (its id was reused),
    // 11 is an agent thread, 12 is gone.
    let registered = [
        (10, false),
        (11, true),
        (12, false),
        (13, false),
        (10, false),
    ];
    let live = latest_of_live_threads(&registered, |tid| tid == 12);
    assert_eq!(live, vec![4, 3]);
    assert!(latest_of_live_threads(&[], |_| false).is_empty());
}

#[test]
fn registrations_during_the_pass_make_it_not_count() {
    assert_eq!(registration_verdict((0, 5), (0, 5)), Ok(()));
    // A thread was registering before the listing but is done: it was listed.
    assert_eq!(registration_verdict((1, 5), (0, 5)), Ok(()));
    assert_eq!(registration_verdict((0, 5), (1, 5)), Err(Obstacle::Moving));
    assert_eq!(registration_verdict((0, 5), (0, 6)), Err(Obstacle::Moving));
}

#[test]
fn a_thread_in_hook_code_or_running_unseen_keeps_the_hooks_in() {
    let hook_code = |pc: u64| (0x7000_0000..0x7000_1000).contains(&pc);
    assert_eq!(thread_verdict(7, Some(0x4000), hook_code, || true), Ok(()));
    assert_eq!(
        thread_verdict(7, Some(0x7000_0010), hook_code, || true),
        Err(Obstacle::InsideHook(7))
    );
    assert_eq!(
        thread_verdict(7, None, hook_code, || true),
        Err(Obstacle::Unstoppable(7))
    );
    assert_eq!(thread_verdict(7, None, hook_code, || false), Ok(()), "gone");
}

#[test]
fn the_unwinders_own_trampolines_are_told_apart_by_address() {
    let internal = [(0x1000, 0x1100), (0x3000, 0x3100)];
    assert!(in_any(0x1000, internal.iter().copied()));
    assert!(in_any(0x30ff, internal.iter().copied()));
    assert!(
        !in_any(0x1100, internal.iter().copied()),
        "end is exclusive"
    );
    assert!(!in_any(0x2000, internal.iter().copied()));
}

#[test]
fn obstacles_read_as_the_reason_the_hooks_stay() {
    assert_eq!(
        AgentError::from(Obstacle::InsideHook(42)).to_string(),
        "thread 42 is inside tendril's hook code"
    );
    assert_eq!(
        AgentError::from(Obstacle::Moving).to_string(),
        "threads were entering tendril's hooks"
    );
}

#[test]
fn a_thread_asleep_at_the_stop_and_running_since_counts_unless_it_finished_a_slow_call() {
    const COUNT_AT: u64 = 0x5000;
    let finished_now = std::cell::Cell::new(7);
    let read = |address: u64| (address == COUNT_AT).then(|| finished_now.get());
    let finished = [(10, COUNT_AT, 7), (30, COUNT_AT, 7)];
    let mut stopped = [];
    let world = StoppedWorld {
        stopped: &mut stopped,
        asleep: &[10, 20, 30, 40],
        halted: &[40],
        peeked: &[],
    };
    // Registered, and no slow call finished since the count was read.
    assert!(asleep_at_the_stop(10, &world, &finished, read));
    // Never registered: it has no slow call to be in.
    assert!(asleep_at_the_stop(20, &world, &finished, read));
    // Stopped or gone at the stop: it may have been anywhere.
    assert!(!asleep_at_the_stop(40, &world, &finished, read));
    // Running at the stop (it should have parked), or started since.
    assert!(!asleep_at_the_stop(50, &world, &finished, read));
    // A slow call finished since: it may have been inside one at the stop.
    finished_now.set(8);
    assert!(!asleep_at_the_stop(10, &world, &finished, read));
    // A count that cannot be read settles nothing.
    assert!(!asleep_at_the_stop(10, &world, &[(10, 0x6000, 7)], read));
}
