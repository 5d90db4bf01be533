use super::*;

#[test]
fn a_missing_directory_is_named_in_one_line() {
    let error = open(&[PathBuf::from("/nonexistent/scope")]).unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("--cgroup-scope /nonexistent/scope: "),
        "{message}"
    );
    assert!(!message.contains('\n'));
}

#[test]
fn a_directory_outside_cgroup2_is_refused() {
    let directory = tempfile::tempdir().unwrap();
    let error = open(&[directory.path().to_owned()]).unwrap_err();
    assert!(
        error.to_string().contains("not a cgroup v2 directory"),
        "{error}"
    );
}

#[test]
fn a_file_is_refused() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let error = open(&[file.path().to_owned()]).unwrap_err();
    assert!(error.to_string().ends_with("not a directory"), "{error}");
}

#[test]
fn more_scopes_than_the_map_holds_are_refused() {
    let paths = vec![PathBuf::from("/"); MAX_CGROUP_SCOPES as usize + 1];
    assert!(matches!(open(&paths), Err(ScopeError::TooMany { .. })));
}

#[test]
fn a_directory_without_cgroup2_is_its_own_hierarchy_path() {
    let plain = tempfile::tempdir().unwrap();
    std::fs::create_dir(plain.path().join("unified")).unwrap();
    assert_eq!(hierarchy_path(plain.path()), plain.path());
}

/// A hybrid host's layout: a directory that is not cgroup v2, with the v2 hierarchy at its
/// `unified`. Needs root to mount; skipped without.
#[test]
fn on_a_hybrid_layout_the_hierarchy_is_at_unified() {
    let Some(layout) = HybridLayout::mount() else {
        return;
    };
    let found = find_hierarchy_root(layout.host()).map(|(path, _)| path);
    assert_eq!(found, Ok(layout.unified()));
    assert_eq!(hierarchy_path(layout.host()), layout.unified());
}

/// Needs root to mount; skipped without.
#[test]
fn a_scope_admits_its_directories_and_those_below_them_only() {
    // SAFETY: geteuid(2) has no failure mode.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let mut hierarchy = openim_test_kit::cgroup2::Cgroup2Mount::mount();
    let inside = hierarchy.child("inside");
    let below = inside.join("below");
    std::fs::create_dir(&below).unwrap();
    let outside = hierarchy.child("outside");
    let membership = ScopeMembership::new(
        hierarchy.root().to_owned(),
        &open(std::slice::from_ref(&inside)).unwrap(),
    );
    assert!(membership.admits(Some(&inside)));
    assert!(membership.admits(Some(&below)));
    assert!(!membership.admits(Some(&outside)));
    assert!(!membership.admits(Some(hierarchy.root())));
    // A process whose cgroup could not be placed is not taken for one inside.
    assert!(!membership.admits(None));
    std::fs::remove_dir(&below).unwrap();

    let everyone = ScopeMembership::new(hierarchy.root().to_owned(), &[]);
    assert!(everyone.admits(None));
    assert!(everyone.admits(Some(&outside)));
}

/// Needs root (CAP_SYS_ADMIN) to mount; skipped without.
#[test]
fn a_private_mount_reaches_the_root_of_the_same_hierarchy() {
    // SAFETY: geteuid(2) has no failure mode.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let root = mount_private_hierarchy().unwrap();
    let mounted = openim_test_kit::cgroup2::Cgroup2Mount::mount();
    let (private, known) = (
        root.metadata().unwrap(),
        std::fs::metadata(mounted.root()).unwrap(),
    );
    assert_eq!(
        (private.dev(), private.ino()),
        (known.dev(), known.ino()),
        "the private mount is the hierarchy's root"
    );
}

#[test]
fn no_scope_opens_nothing() {
    assert!(open(&[]).unwrap().is_empty());
}
