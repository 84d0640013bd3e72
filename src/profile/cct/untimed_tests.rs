//! The CCT builder's tests of untimed calls that come after their frame closed: a
//! thread keeps the calls its outermost frames made past their exits (the agent's
//! `untimed_table`), and writes them out later, outside any open frame.

use super::*;
use crate::profile::tests_support::{entry, exit, info, names};
use crate::profile::untimed_calls::UNKNOWN_CALLER;
use tendril_wire::events::{CALL_ADDRESS_BITS, EventKind};

const NAMES: [&str; 4] = ["main", "fib", "work", "other"];

/// `count` calls of `function` made by `caller`, as the recorder passes them on.
fn calls(function: u32, caller: u32, count: u64) -> Event {
    Event::new(
        EventKind::Call,
        function,
        u64::from(caller) | (count - 1) << CALL_ADDRESS_BITS,
    )
}

/// 1 tick = 1 ns; an untimed call costs its caller 2 ns.
fn builder() -> CctBuilder {
    CctBuilder::new(Calibration {
        tsc_hz: 1_000_000_000,
        untimed_ns: 2.0,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn calls_written_after_the_outermost_exits_belong_to_the_frame_closed_last() {
    let mut builder = builder();
    // Two calls of `fib` (id 1) whose calls of `work` (2) and, below it, `other` (3)
    // come after both exits, then a third call with its calls inside it.
    builder.push_events(
        7,
        &[
            entry(1, 0),
            exit(1, 100),
            entry(1, 200),
            exit(1, 300),
            calls(2, 1, 20),
            calls(3, 2, 40),
            entry(1, 400),
            calls(2, 1, 10),
            exit(1, 500),
        ],
    );
    let profile = builder.snapshot(&info(), &names(&NAMES));
    let roots = &profile.threads[0].roots;
    assert_eq!(roots.len(), 1, "{roots:#?}");
    let fib = &roots[0];
    assert_eq!((fib.name.as_str(), fib.calls), ("fib", 3));
    let work = &fib.children[0];
    assert_eq!((work.name.as_str(), work.calls), ("work", 30));
    assert_eq!(
        (work.children[0].name.as_str(), work.children[0].calls),
        ("other", 40)
    );
    // 300 ns measured, less the hooks of 70 untimed calls.
    assert_eq!(fib.total_ns, 300 - 70 * 2);
}

#[test]
fn calls_with_no_frame_ever_closed_are_discarded() {
    let mut builder = builder();
    builder.push_events(7, &[calls(2, UNKNOWN_CALLER, 5), entry(1, 0), exit(1, 10)]);
    let profile = builder.snapshot(&info(), &names(&NAMES));
    let fib = &profile.threads[0].roots[0];
    assert!(fib.children.is_empty(), "{fib:#?}");
    assert_eq!(fib.total_ns, 10);
}
