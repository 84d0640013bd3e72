//! `tendril edges` refusing what it cannot do, in one line and before it touches the
//! target: a name that matches nothing or several functions, a function the agent
//! refuses, and an output path it cannot write.

use super::{agent_loaded, finish, number, refused, start_edges, target_round};
use crate::common::{Target, code_bytes_match_file};
use serde_json::Value;
#[test]
fn a_missing_name_or_a_glob_of_several_is_one_line_before_anything_is_loaded() {
    let target = Target::spawn("branches", &["stdin"]);
    let pid = target.pid();
    let did_you_mean =
        format!("tendril: no function matches 'clasify' in pid {pid} — did you mean: classify");
    refused(pid, &["clasify"], &did_you_mean);
    let several = refused(pid, &["branches:d*"], "tendril: 'branches:d*' matches ");
    for part in [
        "dispatch (branches)",
        "depth (branches)",
        "name one function",
    ] {
        assert!(several.contains(part), "{several}");
    }
    assert!(!agent_loaded(pid), "nothing was loaded into the target");
}

#[test]
fn a_function_the_agent_refuses_is_one_line_with_the_reason_and_left_as_it_was() {
    let mut target = Target::spawn("throw_through", &["0"]);
    let bare = target_round(&mut target);
    // relay is being profiled already: a second `edges` on it is refused by the agent.
    let first = start_edges(target.pid(), &["relay*", "--json"]);
    let start = "tendril: cannot profile relay(unsigned int)'s edges: ";
    let reason = refused(target.pid(), &["relay*"], start);
    assert!(reason.contains("instrumented already"), "{reason}");
    // The first one goes on, undisturbed.
    target_round(&mut target);
    let json: Value = serde_json::from_str(&finish(first)).unwrap();
    assert_eq!(number(&json["calls"]), 1000, "{json}");
    code_bytes_match_file(target.pid()).unwrap();
    assert_eq!(target_round(&mut target), bare);
}

#[test]
fn a_bad_output_path_is_refused_before_the_target_is_touched() {
    let target = Target::spawn("branches", &["stdin"]);
    let args = ["classify", "-o", "/nonexistent-tendril-dir/out.txt"];
    let start = "tendril: cannot write the profile to /nonexistent-tendril-dir/out.txt: \
                 the directory /nonexistent-tendril-dir does not exist";
    refused(target.pid(), &args, start);
    assert!(!agent_loaded(target.pid()));
}
