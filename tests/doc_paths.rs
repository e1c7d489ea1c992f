//! The docs cannot name a file, or a section, that is not there.
//!
//! Every path and every file name in backticks, and every relative link, in `README.md`,
//! `ARCHITECTURE.md`, `docs/`, `loom_tests/README.md` and the doc comments of `src/` and
//! `examples/` must exist in the tree: a path as written (from the repository's root, or as the
//! tail of a real path, as `writer/run.rs` names `src/cache/writer/run.rs`), a bare `file.rs` as
//! the name of some file. Paths into libfabric's own source (`src/fabric.c:962`) are C files, and
//! its man pages (`man/fi_mr.3.md`) are not in this tree: neither is checked here.
//!
//! A section named in quotes must be a heading of what names it: `docs/x.md`, "Heading" (or
//! `docs/x.md` ("Heading"), or the README, "Heading"), `src/file.rs`, "Heading" and `module`,
//! "Heading" (a `# Heading` of that file's doc comments), [`Item`], "Heading" (one of the file
//! that declares the item), "the README's Heading section", and "Heading", above (or below) in
//! the same doc. A heading is named by its text or by how it starts: "Connection setup" names
//! `## Connection setup: the first message of a fresh pair`.

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

/// The Rust files whose doc comments the test reads: `src/` and `examples/`, sorted.
fn rust_docs(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = tree(root)
        .into_iter()
        .filter(|path| {
            (path.starts_with("src/") || path.starts_with("examples/")) && path.ends_with(".rs")
        })
        .map(|path| root.join(path))
        .collect();
    files.sort();
    files
}

/// What a doc says, line by line: a Markdown file as it is, a Rust file's doc comments (`///`,
/// `//!`) without their markers, its other lines left empty.
fn doc_text(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("a doc is readable");
    if path.extension().is_none_or(|extension| extension != "rs") {
        return text;
    }
    text.lines()
        .map(|line| {
            let line = line.trim_start();
            line.strip_prefix("///")
                .or_else(|| line.strip_prefix("//!"))
                .map_or("", |doc| doc.strip_prefix(' ').unwrap_or(doc))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The headings of a doc's text, where a reader finds a named section: each line that starts
/// with `#` (without the `#`s), the bold lead that opens a line or a list item
/// (`- **What the doze costs: the reclamation delay.**`), and the first line of every other
/// paragraph (`Why what is not met is not met, as far as measured:`).
fn headings(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut paragraph_start = true;
    for line in text.lines().map(str::trim) {
        let item = line
            .strip_prefix("- ")
            .or_else(|| line.strip_prefix("* "))
            .unwrap_or(line);
        let bold = item
            .strip_prefix("**")
            .and_then(|bold| bold.split_once("**"))
            .map(|(bold, _)| bold);
        if line.starts_with('#') {
            found.push(line.trim_start_matches('#').trim().to_string());
        } else if let Some(bold) = bold {
            found.push(bold.to_string());
        } else if paragraph_start && !line.is_empty() {
            found.push(line.to_string());
        }
        paragraph_start = line.is_empty();
    }
    found.retain(|heading| !heading.is_empty());
    found
}

/// Whether `heading` is named by `name`: its whole text, or how it starts up to a stop (`:`,
/// `,`, `.`, `;`, ` (`, a dash), any case: "Connection setup" names "Connection setup: the
/// first message", "Connection" does not.
fn heading_named(heading: &str, name: &str) -> bool {
    let heading = heading.to_lowercase();
    let name = name.to_lowercase();
    heading.strip_prefix(&name).is_some_and(|rest| {
        rest.is_empty()
            || [":", ",", ".", ";", " (", " —", " –", " -"]
                .iter()
                .any(|stop| rest.starts_with(stop))
    })
}

/// Where a doc sends its reader for a section.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A file by its path or name (`docs/x.md`, `writer/mod.rs`, `README`).
    File(String),
    /// A module by its name (`completions`, `endpoint::completions`).
    Module(String),
    /// An item by its name (`MemoryRegion`), in the file that declares it.
    Item(String),
    /// The doc that names the section ("X", above).
    Same,
}

/// The sections a doc's text names, with where: what precedes a quoted heading (a file, a
/// module or an item in backticks, a file's path, the README), or "above"/"below" after it,
/// and "the README's X section".
fn sections(text: &str) -> Vec<(Target, String)> {
    // One line: a reference may break across lines.
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(offset) = text[from..].find('"') {
        let open = from + offset;
        from = open + 1;
        let quoted = quoted_list(&text[open..]);
        if quoted.is_empty() {
            continue;
        }
        let after = &text[open + quoted.iter().map(|(_, len)| len).sum::<usize>()..];
        let names = quoted.iter().map(|(name, _)| name.clone());
        let target = if after.starts_with(", above") || after.starts_with(", below") {
            Some(Target::Same)
        } else {
            target_before(&text[..open])
        };
        if let Some(target) = target {
            found.extend(names.map(|name| (target.clone(), name)));
            from = open + quoted.iter().map(|(_, len)| len).sum::<usize>();
        }
    }
    let mut rest = text.as_str();
    while let Some(at) = rest.find("README's ") {
        rest = &rest[at + "README's ".len()..];
        if let Some(end) = rest.find(" section")
            && end <= 60
            && !rest[..end].contains(['.', ';', ','])
        {
            found.push((
                Target::File("README.md".into()),
                rest[..end].replace('"', ""),
            ));
        }
    }
    found
}

/// The quoted headings at the start of `text`: `"A"`, `"A", "B"` or `"A" and "B"`, each with
/// how many bytes it and what joins it to the one before take. Empty when `text` does not open
/// a short quotation.
fn quoted_list(text: &str) -> Vec<(String, usize)> {
    let mut list = Vec::new();
    let mut rest = text;
    let mut joiner = 0;
    while let Some(inner) = rest.strip_prefix('"') {
        let Some(close) = inner.find('"') else {
            break;
        };
        if !(2..=80).contains(&close) {
            break;
        }
        list.push((inner[..close].to_string(), joiner + close + 2));
        rest = &inner[close + 1..];
        joiner = [", ", " and "]
            .iter()
            .find(|join| rest.starts_with(&format!("{join}\"")))
            .map_or(0, |join| join.len());
        if 0 == joiner {
            break;
        }
        rest = &rest[joiner..];
    }
    list
}

/// What the text just before a quoted heading points at, if anything: `` `x`, `` or
/// `` `x` ( ``, `` [`X`], ``, `docs/x.md, `, `README, `.
fn target_before(before: &str) -> Option<Target> {
    let mut head = before.trim_end();
    head = head.strip_suffix('(').unwrap_or(head).trim_end();
    head = head.strip_suffix(',').unwrap_or(head);
    if let Some(inside) = head.strip_suffix("`]") {
        let name = inside.rsplit('`').next()?;
        return identifier(name).then(|| Target::Item(name.to_string()));
    }
    if let Some(inside) = head.strip_suffix('`') {
        let name = inside.rsplit('`').next()?;
        if name.ends_with(".md") || name.ends_with(".rs") {
            return Some(Target::File(name.to_string()));
        }
        return name
            .split("::")
            .all(identifier)
            .then(|| name.chars().all(|letter| !letter.is_uppercase()))
            .filter(|lower| *lower)
            .map(|_| Target::Module(name.to_string()));
    }
    let word = head.rsplit(' ').next()?.trim_start_matches('(');
    let word = word.strip_suffix("'s").unwrap_or(word);
    if word == "README" {
        return Some(Target::File("README.md".into()));
    }
    (word.ends_with(".md") || word.ends_with(".rs")).then(|| Target::File(word.to_string()))
}

fn identifier(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|letter| letter.is_ascii_alphanumeric() || letter == '_')
        && !name.starts_with(|letter: char| letter.is_ascii_digit())
}

/// The file (relative to the root) that `target` names, from a doc at `doc` (relative), or
/// why there is none; an empty path for what is not in this tree (libfabric's `man/`).
fn resolve(root: &Path, tree: &[String], doc: &str, target: &Target) -> Result<String, String> {
    let doc_dir = doc
        .rsplit_once('/')
        .map_or(String::new(), |(dir, _)| format!("{dir}/"));
    match target {
        Target::Same => Ok(doc.to_string()),
        // libfabric's man pages, not in this tree.
        Target::File(name) if name.starts_with("man/") => Ok(String::new()),
        Target::File(name) => {
            let name = name.trim_start_matches("./");
            tree.iter()
                .find(|path| {
                    *path == name
                        || **path == format!("{doc_dir}{name}")
                        || path.ends_with(&format!("/{name}"))
                })
                .cloned()
                .ok_or_else(|| format!("no file `{name}`"))
        }
        Target::Module(name) => {
            let path = name.replace("::", "/");
            tree.iter()
                .find(|file| {
                    file.starts_with("src/")
                        && (file.ends_with(&format!("/{path}.rs"))
                            || file.ends_with(&format!("/{path}/mod.rs")))
                })
                .cloned()
                .ok_or_else(|| format!("no module `{name}` under src/"))
        }
        Target::Item(name) => tree
            .iter()
            .filter(|file| file.starts_with("src/") && file.ends_with(".rs"))
            .find(|file| {
                let source = std::fs::read_to_string(root.join(file)).unwrap_or_default();
                ["struct", "enum", "trait", "unsafe trait", "type", "fn"]
                    .iter()
                    .any(|kind| {
                        [" ", "<", "(", ";", ":"]
                            .iter()
                            .any(|after| source.contains(&format!("pub {kind} {name}{after}")))
                    })
            })
            .cloned()
            .ok_or_else(|| format!("no file under src/ declares `{name}`")),
    }
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
                && !name.starts_with("man/")
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
    for doc in docs(root).into_iter().chain(rust_docs(root)) {
        let text = doc_text(&doc);
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
fn every_section_the_docs_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tree = tree(root);
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in docs(root).into_iter().chain(rust_docs(root)) {
        let relative = doc
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        for (target, name) in sections(&doc_text(&doc)) {
            checked += 1;
            match resolve(root, &tree, &relative, &target) {
                Err(why) => missing.push(format!("{relative}: {target:?}, \"{name}\": {why}")),
                Ok(file) if file.is_empty() => {}
                Ok(file) => {
                    let found = headings(&doc_text(&root.join(&file)))
                        .iter()
                        .any(|heading| heading_named(heading, &name));
                    if !found {
                        missing.push(format!(
                            "{relative}: \"{name}\" is not a heading of {file} ({target:?})"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} sections found: is the scan broken?"
    );
    assert!(
        missing.is_empty(),
        "the docs name sections that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_scan_finds_the_sections_a_doc_names() {
    let text = "see `docs/benchmarks.md`, \"Connection setup\"; `src/cache/lease.rs`\n\
        (\"Ordering\") and `writer/mod.rs`, \"Bounds\" and \"Callers\"; (see `completions`,\n\
        \"Routing\"), [`MemoryRegion`] (\"Parking\", \"Reuse\"); docs/rma.md, \"Zero copy\"\n\
        (\"Why\", above), the README's RMA section and the README, \"Two commands\". Not a\n\
        reference: `-FI_ENOTCONN` (\"Broken pipe\"), `Some(\"x\")`, a \"quote\" alone.";
    let file = |name: &str| Target::File(name.to_string());
    assert_eq!(
        vec![
            (file("docs/benchmarks.md"), "Connection setup".to_string()),
            (file("src/cache/lease.rs"), "Ordering".to_string()),
            (file("writer/mod.rs"), "Bounds".to_string()),
            (file("writer/mod.rs"), "Callers".to_string()),
            (Target::Module("completions".into()), "Routing".to_string()),
            (Target::Item("MemoryRegion".into()), "Parking".to_string()),
            (Target::Item("MemoryRegion".into()), "Reuse".to_string()),
            (file("docs/rma.md"), "Zero copy".to_string()),
            (Target::Same, "Why".to_string()),
            (file("README.md"), "Two commands".to_string()),
            (file("README.md"), "RMA".to_string()),
        ],
        sections(text)
    );
    let doc = "# Title\n\n## Connection setup: the first message\n### Zero copy\n";
    let found = headings(doc);
    assert!(
        found
            .iter()
            .any(|heading| heading_named(heading, "connection setup"))
    );
    assert!(
        found
            .iter()
            .any(|heading| heading_named(heading, "Zero copy"))
    );
    assert!(
        !found
            .iter()
            .any(|heading| heading_named(heading, "Connection"))
    );
    assert!(!found.iter().any(|heading| heading_named(heading, "RMA")));
    let prose = "Intro.\n\nWhy it is slow, as measured:\n\n- **What the doze costs.** Text\n\
        that goes on.\n";
    assert_eq!(
        vec![
            "Intro.",
            "Why it is slow, as measured:",
            "What the doze costs."
        ],
        headings(prose)
    );
    assert!(heading_named(
        "Why it is slow, as measured:",
        "Why it is slow"
    ));
    assert!(!heading_named("What the doze costs.", "What the"));
    let rust = "/// # Parking\n/// text\nfn x() {}\n//! # Ordering";
    let path = std::env::temp_dir().join(format!("doc_paths_{}.rs", std::process::id()));
    std::fs::write(&path, rust).expect("a scratch file");
    let found = headings(&doc_text(&path));
    std::fs::remove_file(&path).ok();
    assert_eq!(vec!["Parking", "Ordering"], found);
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
