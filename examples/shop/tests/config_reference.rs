//! docs/configuration.md's flag table against `shop --help`: every flag the binary takes
//! is documented with its environment variable and default, and the table names no flag
//! the binary lacks, so the reference cannot drift from the flags.

use std::collections::BTreeMap;
use std::process::Command;

const DOC: &str = include_str!("../../../docs/configuration.md");

/// One flag: its environment variable and default as shown.
#[derive(Debug, PartialEq)]
struct Flag {
    env: Option<String>,
    default: Option<String>,
}

/// The long flags of `shop --help` (clap's long help: a line per flag, then its text with
/// `[env: NAME=]` and `[default: VALUE]`).
fn help_flags() -> BTreeMap<String, Flag> {
    let out = Command::new(env!("CARGO_BIN_EXE_shop"))
        .arg("--help")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .expect("shop --help runs");
    assert!(out.status.success(), "shop --help failed");
    let help = String::from_utf8(out.stdout).expect("UTF-8 help");
    let mut flags = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    let mut finish = |current: Option<(String, String)>| {
        if let Some((name, text)) = current {
            let bracket = |tag: &str| {
                let start = text.find(&format!("[{tag}: "))? + tag.len() + 3;
                let end = start + text[start..].find(']')?;
                Some(text[start..end].trim_end_matches('=').to_owned())
            };
            flags.insert(
                name,
                Flag {
                    env: bracket("env"),
                    default: bracket("default"),
                },
            );
        }
    };
    for line in help.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("--").filter(|_| line.starts_with("      --")) {
            finish(current.take());
            let name = rest.split([' ', '<']).next().unwrap_or_default().to_owned();
            current = Some((format!("--{name}"), String::new()));
        } else if let Some((_, text)) = current.as_mut() {
            text.push_str(trimmed);
            text.push(' ');
        }
    }
    finish(current);
    flags.remove("--help");
    flags.remove("--version");
    flags
}

/// The rows of the table under `## Flags`: flag, env, default (cells without backticks).
fn doc_flags() -> BTreeMap<String, Flag> {
    let table = DOC.split("## Flags").nth(1).expect("a `## Flags` section");
    let table = table.split("\n## ").next().unwrap_or(table);
    let cell = |c: &str| {
        let c = c.trim().trim_matches('`').to_owned();
        (!c.is_empty()).then_some(c)
    };
    table
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .map(|l| {
            // Only the first three cells matter; the meaning may hold anything.
            let cells: Vec<&str> = l.trim_start_matches('|').splitn(4, '|').collect();
            let name = cells[0].trim().trim_matches('`');
            let name = name.split(' ').next().unwrap_or(name).to_owned();
            (
                name,
                Flag {
                    env: cell(cells[1]),
                    default: cell(cells[2]),
                },
            )
        })
        .collect()
}

#[test]
fn the_configuration_reference_documents_every_flag_as_the_binary_has_it() {
    let help = help_flags();
    let doc = doc_flags();
    assert!(help.len() > 20, "the --help parser found only {help:?}");
    let missing: Vec<_> = help.keys().filter(|f| !doc.contains_key(*f)).collect();
    let stale: Vec<_> = doc.keys().filter(|f| !help.contains_key(*f)).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/configuration.md lacks {missing:?} and documents flags shop does not have: {stale:?}"
    );
    for (name, flag) in &help {
        let documented = &doc[name];
        assert_eq!(documented.env, flag.env, "environment variable of {name}");
        // A default the binary shows must be the documented one; the table may describe
        // a computed default (`http://<--http>`, a path) in words where --help shows none.
        if let Some(default) = &flag.default {
            assert_eq!(documented.default.as_ref(), Some(default), "default of {name}");
        }
    }
}
