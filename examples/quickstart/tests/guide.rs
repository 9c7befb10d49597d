//! docs/guide.md builds this crate step by step under the name `bank`: every file it shows
//! must be this crate's file, so the guide cannot drift from code that is tested.

const GUIDE: &str = include_str!("../../../docs/guide.md");

/// `path` as the guide shows it: a ```rust block holding the whole file, `bank` for
/// `quickstart`.
fn assert_shown(path: &str, text: &str) {
    let block = format!("```rust\n{}```\n", text.replace("quickstart::", "bank::"));
    assert!(
        GUIDE.contains(&block),
        "docs/guide.md does not show examples/quickstart/{path} as it is; the file:\n{text}"
    );
}

#[test]
fn the_guide_shows_every_file_of_the_crate_as_it_is() {
    assert_shown("src/lib.rs", include_str!("../src/lib.rs"));
    assert_shown("src/account.rs", include_str!("../src/account.rs"));
    assert_shown("src/view.rs", include_str!("../src/view.rs"));
    assert_shown("src/main.rs", include_str!("../src/main.rs"));
    assert_shown("tests/account.rs", include_str!("account.rs"));
    assert_shown("tests/view.rs", include_str!("view.rs"));
}

#[test]
fn the_guide_shows_the_crate_manifest_without_its_test_only_parts() {
    let manifest = include_str!("../Cargo.toml");
    let shown = manifest.split("\n[dev-dependencies]").next().unwrap_or(manifest);
    let block = format!("```toml\n{}\n```\n", shown.replace("\"quickstart\"", "\"bank\""));
    assert!(
        GUIDE.contains(&block),
        "docs/guide.md shows another Cargo.toml:\n{shown}"
    );
}
