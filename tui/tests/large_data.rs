//! Large and deep data: a 10,000-level recursion, a 100,000-node tree and a 100,000-entry
//! function list must stay usable, and nothing may recurse on the call stack.

mod common;

use common::*;
use tendril_tui::crossterm::event::KeyCode;
use tendril_tui::{Action, App, FunctionEntry, ProfileSnapshot, Screen, ThreadSummary, TreeNode};

const DEPTH: usize = 10_000;

/// `recurse` calling itself `DEPTH` levels deep, built without recursion.
fn deep_chain() -> TreeNode {
    let mut node = TreeNode::new("recurse", "calltree", 1, MS, MS);
    for level in 1..DEPTH {
        node = TreeNode::new("recurse", "calltree", 1, (level + 1) as f64 * MS, MS)
            .with_children([node]);
    }
    node
}

/// Runs `body` on a thread with a stack far too small for a recursive walk of the chain.
fn on_small_stack(body: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(body)
        .expect("spawn")
        .join()
        .expect("the deep tree overflowed a 256 KiB stack or panicked");
}

#[test]
fn a_10000_deep_tree_is_browsed_cloned_compared_and_dropped_without_recursion() {
    on_small_stack(|| {
        let chain = deep_chain();
        assert_eq!(chain.depth(), DEPTH);
        assert_eq!(chain.node_count(), DEPTH);
        let copy = chain.clone();
        assert_eq!(copy, chain);
        let snapshot = ProfileSnapshot {
            merged: vec![chain],
            threads: vec![ThreadSummary {
                tid: 1,
                name: "main".into(),
                calls: DEPTH as u64,
                total_ns: DEPTH as f64 * MS,
                roots: vec![copy],
            }],
            status: status(),
        };
        let mut app = App::new(Screen::Live(snapshot.clone()));
        screen(&mut app, 80, 24);
        press_char(&mut app, 'h'); // expand all the way down, select the deepest node
        let rows = screen(&mut app, 80, 24);
        assert!(
            rows.iter().any(|row| row.contains("9999→")),
            "deep rows show their depth:\n{rows:#?}"
        );
        press(&mut app, KeyCode::Home);
        press(&mut app, KeyCode::PageDown);
        press(&mut app, KeyCode::End);
        app.update_snapshot(snapshot.clone());
        screen(&mut app, 80, 24);
        press_char(&mut app, '2');
        let text = screen_text(&mut app, 80, 24);
        // One function: 10,000 ms of self time, total counted once at the outermost level.
        let row = text
            .lines()
            .find(|line| line.starts_with("recurse"))
            .expect("hot spot row");
        assert!(
            row.contains("10000") && row.contains(&DEPTH.to_string()),
            "{row}"
        );
        press_char(&mut app, '3');
        press(&mut app, KeyCode::Enter);
        screen(&mut app, 80, 24);
        press_char(&mut app, 'c');
        screen(&mut app, 80, 24);
        drop(app);
        drop(snapshot);
    });
}

#[test]
fn a_100000_node_tree_shows_only_what_is_expanded() {
    let children = (0..1000).map(|outer| {
        let leaves =
            (0..99).map(|inner| TreeNode::new(format!("leaf_{outer}_{inner}"), "m", 1, 1.0, 1.0));
        TreeNode::new(
            format!("branch_{outer:04}"),
            "m",
            100,
            100.0 + outer as f64,
            1.0,
        )
        .with_children(leaves)
    });
    let root = TreeNode::new("main", "m", 1, 1e9, 1.0).with_children(children);
    assert_eq!(root.node_count(), 100_001);
    let snapshot = ProfileSnapshot {
        merged: vec![root],
        ..ProfileSnapshot::default()
    };
    let mut app = App::new(Screen::Live(snapshot.clone()));
    let rows = screen(&mut app, 100, 20);
    assert!(
        rows[3].contains("branch_0999"),
        "hottest branch first: {}",
        rows[3]
    );
    press(&mut app, KeyCode::End);
    let rows = screen(&mut app, 100, 20);
    assert!(
        rows.iter().any(|row| row.contains("branch_0000")),
        "End reaches the last branch"
    );
    press(&mut app, KeyCode::Right);
    for _ in 0..5 {
        app.update_snapshot(snapshot.clone());
        let text = screen_text(&mut app, 100, 20);
        assert!(
            text.contains("leaf_0_"),
            "the last branch stays open and in view:\n{text}"
        );
    }
}

#[test]
fn the_root_picker_filters_100000_functions() {
    let functions: Vec<FunctionEntry> = (0..100_000)
        .map(|index| FunctionEntry {
            name: format!("ns{}::module{}::function_{index}", index % 97, index % 13),
            module: format!("lib{}.so", index % 7),
            size: 64,
            address: 0x40_0000 + index as u64 * 64,
        })
        .collect();
    let mut app = App::new(Screen::RootPicker(functions));
    assert!(screen_text(&mut app, 80, 24).contains("100,000 of 100,000 functions"));
    type_text(&mut app, "function_9999");
    let rows = screen(&mut app, 80, 24);
    assert!(rows[0].contains("of 100,000 functions"), "{}", rows[0]);
    assert!(
        rows[2].contains("function_9999"),
        "the closest match comes first: {}",
        rows[2]
    );
    for _ in 0.."function_9999".len() {
        press(&mut app, KeyCode::Backspace);
    }
    assert!(screen_text(&mut app, 80, 24).contains("100,000 of 100,000 functions"));
    type_text(&mut app, "_12345");
    let Some(Action::SetRoots(roots)) = press(&mut app, KeyCode::Enter) else {
        panic!("Enter must choose")
    };
    assert!(roots[0].name.ends_with("function_12345"), "{roots:?}");
}
