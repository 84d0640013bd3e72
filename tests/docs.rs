//! The repository stands alone: every file the README, the user guide and the design
//! document point to is in it, and nothing points outside it.

use std::path::Path;

/// The targets of the Markdown links `[text](target)` in `text` that are not URLs.
fn local_links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target))
        .map(|target| target.split('#').next().unwrap_or("").to_string())
        .filter(|target| !target.is_empty() && !target.contains("://"))
        .collect()
}

#[test]
fn the_readme_the_guide_and_the_design_point_only_inside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .canonicalize()
        .unwrap();
    for document in ["README.md", "docs/GUIDE.md", "docs/DESIGN.md"] {
        let path = root.join(document);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{document} is missing from the repository: {e}"));
        let base = path.parent().unwrap();
        for link in local_links(&text) {
            let target = base.join(&link).canonicalize();
            assert!(
                target.is_ok_and(|target| target.starts_with(&root)),
                "{document} links to {link}, which is not in the repository"
            );
        }
    }
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        local_links(&readme).iter().any(|l| l == "docs/DESIGN.md"),
        "the README links to the design document"
    );
}

#[test]
fn the_help_says_that_plain_tendril_opens_the_process_picker() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tendril"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    assert!(
        help.contains("Plain `tendril`, without a command, opens the terminal UI's process picker"),
        "{help}"
    );
}
