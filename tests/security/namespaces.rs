//! A target in namespaces its user made: a user namespace (`unshare -U`, as in a
//! rootless container) and a mount namespace in which they put any directory at `/tmp`.
//! Root's tendril profiles the first, and never creates anything through the second.

use super::{Target, as_user, serial, status, status_ok, tendril, test_user};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// A directory of root's that no other user may write, with one file in it.
struct RootOnlyDir {
    path: PathBuf,
}

impl RootOnlyDir {
    fn new() -> RootOnlyDir {
        let path = PathBuf::from(format!(
            "/tmp/tendril-sectest-rootonly-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::fs::write(path.join("keep"), b"root's").unwrap();
        RootOnlyDir { path }
    }

    /// Nothing was made in it, and it is still root's.
    fn assert_untouched(&self) {
        let meta = std::fs::metadata(&self.path).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o755));
        let entries: Vec<String> = std::fs::read_dir(&self.path)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            entries,
            ["keep"],
            "something was made in {}",
            self.path.display()
        );
    }
}

impl Drop for RootOnlyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[test]
fn a_process_in_a_user_namespace_of_its_users_own_is_profiled() {
    let _turn = serial();
    let (uid, gid) = test_user();
    as_user("true");
    let target = Target::spawn_wrapped("calltree", &["1"], &["unshare", "-Ur"], Some((uid, gid)));
    status_ok(target.pid());
    let output = tendril()
        .args([
            "count",
            &target.pid().to_string(),
            "mix",
            "--duration",
            "0.5",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains(" mix"));
    super::common::code_bytes_match_file(target.pid()).unwrap();
}

#[test]
fn a_directory_of_roots_bound_at_the_targets_tmp_gets_nothing_from_root() {
    let _turn = serial();
    let (uid, gid) = test_user();
    let root_only = RootOnlyDir::new();
    // The fixture is run from a descriptor opened before the mount: a repository
    // under /tmp (a clone in /tmp/ci-check) would be hidden by it.
    let mount = format!(
        "exec 3<\"$0\" && mount --bind {} /tmp && exec /proc/self/fd/3 \"$@\"",
        root_only.path.display()
    );
    let target = Target::spawn_wrapped(
        "calltree",
        &["1"],
        &["unshare", "-Urm", "sh", "-c", &mount],
        Some((uid, gid)),
    );
    let (ok, stdout, stderr) = status(target.pid());
    root_only.assert_untouched();
    // The agent, as the target's user, cannot make its directory there: said in one line.
    assert!(!ok, "{stdout}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("/tmp is writable by its user"), "{stderr}");
}
