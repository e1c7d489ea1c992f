//! The docs cannot name a file that is not there.
//!
//! Every path and every file name in backticks, and every relative link, in `README.md`,
//! `ARCHITECTURE.md`, `docs/` and `loom_tests/README.md` must exist in the tree: a path as
//! written (from the repository's root, or as the tail of a real path, as `writer/run.rs` names
//! `src/cache/writer/run.rs`), a bare `file.rs` as the name of some file. Paths into libfabric's
//! own source (`src/fabric.c:962`) are C files, and not checked here.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::path::{Path, PathBuf};

/// What a doc names that is checked: files with these extensions. (libfabric's C files and
/// scripts are named as what they are, and are not ours to check.)
const CHECKED: &[&str] = &[".rs", ".md", ".toml"];

/// Every file and folder under the root, as paths relative to it, skipping build output.
fn tree(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&relative)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "target" || name.starts_with('.') {
                continue;
            }
            let path = relative.join(&name);
            let text = path.to_string_lossy().replace('\\', "/");
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                found.push(format!("{text}/"));
                stack.push(path);
            } else {
                found.push(text);
            }
        }
    }
    found
}

/// The docs the test reads.
fn docs(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("loom_tests/README.md"),
    ];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "md"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    docs
}

/// The names a doc gives: backticked words that look like paths, and relative link targets.
fn named(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (index, span) in text.split('`').enumerate() {
        // Odd pieces are inside backticks; a fenced block's lines fall out as words with spaces.
        if index % 2 == 1 && !span.contains(char::is_whitespace) {
            names.push(span.to_string());
        }
    }
    for link in text.split("](").skip(1) {
        let target = link.split(')').next().unwrap_or("");
        if !target.contains("://") && !target.starts_with('#') && !target.is_empty() {
            names.push(target.split('#').next().unwrap_or("").to_string());
        }
    }
    names
        .into_iter()
        .map(|name| {
            // `file.rs:120` and `file.rs` name the same file.
            let name = name.split(':').next().unwrap_or("").to_string();
            name.trim_start_matches("./").to_string()
        })
        .filter(|name| {
            !name.is_empty()
                && !name.contains('*')
                && !name.starts_with("../")
                && !name.starts_with('/')
                && !name.contains("::")
                && CHECKED.iter().any(|extension| name.ends_with(extension))
        })
        .collect()
}

fn exists(tree: &[String], doc_dir: &str, name: &str) -> bool {
    let relative_to_doc = format!("{doc_dir}{name}");
    tree.iter().any(|path| {
        path == name
            || *path == relative_to_doc
            || path.ends_with(&format!("/{name}"))
            || (!name.contains('/') && path.rsplit('/').next() == Some(name))
    })
}

#[test]
fn every_file_the_docs_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tree = tree(root);
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in docs(root) {
        let text = std::fs::read_to_string(&doc).expect("a doc is readable");
        let relative = doc.strip_prefix(root).expect("under the root");
        let doc_dir = relative
            .parent()
            .map(|parent| parent.to_string_lossy().replace('\\', "/"))
            .filter(|parent| !parent.is_empty())
            .map_or(String::new(), |parent| format!("{parent}/"));
        for name in named(&text) {
            checked += 1;
            if !exists(&tree, &doc_dir, &name) {
                missing.push(format!("{}: `{name}`", relative.display()));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} names found: is the scan broken?"
    );
    assert!(
        missing.is_empty(),
        "the docs name files that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_scan_finds_what_a_doc_names_and_rejects_a_file_that_is_not_there() {
    let tree = vec![
        "src/".to_string(),
        "src/cache/".to_string(),
        "src/cache/writer/".to_string(),
        "src/cache/writer/run.rs".to_string(),
        "docs/guarantees.md".to_string(),
    ];
    let names = named(
        "see `src/cache/writer/run.rs:45`, `writer/run.rs`, `run.rs`, \
         [the guarantees](guarantees.md#bounds) and `src/cache/writer.rs`; not `crate::sys`",
    );
    assert_eq!(
        vec![
            "src/cache/writer/run.rs",
            "writer/run.rs",
            "run.rs",
            "src/cache/writer.rs",
            "guarantees.md",
        ],
        names
    );
    assert!(exists(&tree, "docs/", "guarantees.md"));
    assert!(exists(&tree, "", "writer/run.rs"));
    assert!(exists(&tree, "", "run.rs"));
    assert!(
        !exists(&tree, "", "src/cache/writer.rs"),
        "the folder is not the file"
    );
    assert!(!exists(&tree, "", "apply.rs"));
}
