//! The library's modules depend on each other one way, bottom up:
//! `error`/`sync` → `address`/`configuration` → `av` → `cache` → `endpoint` → `rails` →
//! `asynchronous`.
//!
//! Read from the source: every `crate::…` path in code (doc comments aside, which may link
//! anywhere) must name a module at or below the one it is written in. Names re-exported at the
//! crate root count as the module they come from. (`super::` never leaves a top-level module
//! here: each is a directory whose files reach their siblings through it.)
//!
//! And no file under `src/` holds more code than a reader keeps in their head: see [`MOST_LINES`].
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::path::{Path, PathBuf};

/// Each top-level module's layer; a module may use its own layer and those below.
const LAYERS: &[(&str, u32)] = &[
    ("sys", 0),
    ("error", 1),
    ("sync", 1),
    ("address", 2),
    ("configuration", 2),
    ("av", 3),
    ("cache", 4),
    ("endpoint", 5),
    ("rails", 6),
    ("asynchronous", 7),
];

/// The crate root's re-exports, read from `lib.rs`: each name with the module that defines it
/// (`pub use cache::{AddressCache, Lease};` gives `("AddressCache", "cache")`, ...; `pub use
/// dma_libfabric_sys as sys;` gives `("sys", "sys")`). Read rather than listed, so a name added
/// at the root is checked from the day it is added.
fn root_names(lib: &str) -> Vec<(String, String)> {
    let mut names = Vec::new();
    let mut statement = String::new();
    for line in lib.lines() {
        let code = line.trim();
        if statement.is_empty() && !code.starts_with("pub use ") {
            continue;
        }
        statement.push_str(code);
        statement.push(' ');
        if !code.ends_with(';') {
            continue;
        }
        let body = statement
            .trim()
            .trim_start_matches("pub use ")
            .trim_end_matches(';')
            .trim()
            .to_string();
        statement.clear();
        if let Some((_, alias)) = body.split_once(" as ") {
            let alias = alias.trim().to_string();
            names.push((alias.clone(), alias));
            continue;
        }
        let module = body.split("::").next().unwrap_or("").trim().to_string();
        let list = match body.split_once('{') {
            Some((_, inner)) => inner.trim_end_matches('}').to_string(),
            None => body.rsplit("::").next().unwrap_or("").to_string(),
        };
        for name in list.split(',') {
            let name = name.trim().rsplit("::").next().unwrap_or("").trim();
            if !name.is_empty() {
                names.push((name.to_string(), module.clone()));
            }
        }
    }
    names
}

/// The root's names, from this crate's `lib.rs`.
fn crate_root_names() -> Vec<(String, String)> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    root_names(&std::fs::read_to_string(lib).expect("read lib.rs"))
}

fn layer(module: &str) -> Option<u32> {
    LAYERS
        .iter()
        .find(|(name, _)| *name == module)
        .map(|(_, layer)| *layer)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The modules a line of code names through `crate::`, a root re-export counting as the module
/// it comes from.
fn named(line: &str, root: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let module = root
            .iter()
            .find(|(exported, _)| *exported == name)
            .map_or(name.clone(), |(_, module)| module.clone());
        found.push(module);
        // `use crate::{a, b}` names several.
        if name.is_empty() && rest.starts_with('{') {
            let inner = rest[1..].split('}').next().unwrap_or("");
            for part in inner.split(',') {
                let part = part.trim().split("::").next().unwrap_or("").trim();
                found.push(part.to_string());
            }
        }
    }
    found
}

#[test]
fn modules_depend_on_lower_layers_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 10, "found the sources: {files:?}");
    let root_names = crate_root_names();
    let mut violations = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&root).expect("under src");
        let top = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or("")
            .trim_end_matches(".rs")
            .to_string();
        let Some(own) = layer(&top) else {
            continue; // lib.rs: the crate root re-exports every layer
        };
        let text = std::fs::read_to_string(file).expect("read");
        for (number, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for module in named(code, &root_names) {
                match layer(&module) {
                    Some(theirs) if theirs > own => violations.push(format!(
                        "{}:{}: `{top}` (layer {own}) uses `{module}` (layer {theirs}): {}",
                        relative.display(),
                        number + 1,
                        code
                    )),
                    _ => {}
                }
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_check_sees_a_dependency_pointing_up() {
    let root = crate_root_names();
    assert_eq!(
        vec!["endpoint".to_string()],
        named("use crate::endpoint::FabricAv;", &root)
    );
    assert_eq!(
        vec!["endpoint".to_string()],
        named("let _ = crate::LibfabricEndpoint::open;", &root)
    );
    assert_eq!(
        vec!["rails".to_string()],
        named("let _ = crate::RailSegment::new;", &root),
        "a root name the old hand-written list missed"
    );
    assert!(
        named("use crate::{cache::Pinned, error::DmaError};", &root).contains(&"cache".to_string())
    );
    assert_eq!(Some(5), layer("endpoint"));
    assert!(layer("endpoint") > layer("cache") && layer("cache") > layer("av"));
}

/// The most lines of code (its `#[cfg(test)] mod tests` aside) a file under `src/` may hold: about
/// what a reader keeps in their head at once.
const MOST_LINES: usize = 700;

/// Files allowed past [`MOST_LINES`], and why.
const LONGER: &[(&str, &str)] = &[
    (
        "cache/mod.rs",
        "AddressCache's public API, whose docs are most of it; not split yet",
    ),
    (
        "endpoint/rma.rs",
        "one concept: operations in flight, from posting to their completion",
    ),
    (
        "endpoint/memory.rs",
        "one concept: a registration's life, keys, and parked buffers",
    ),
];

/// The lines of `text` before its test module.
fn code_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .position(|pair| pair[0] == "#[cfg(test)]" && pair[1].starts_with("mod tests"))
        .unwrap_or(lines.len())
}

#[test]
fn no_source_file_is_longer_than_a_reader_holds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut long = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&root).expect("under src");
        let name = relative.to_string_lossy().replace('\\', "/");
        let lines = code_lines(&std::fs::read_to_string(file).expect("read"));
        if lines > MOST_LINES && !LONGER.iter().any(|(longer, _)| *longer == name) {
            long.push(format!("{name}: {lines} lines of code"));
        }
    }
    assert!(
        long.is_empty(),
        "split these along their seams (or name them in LONGER, with why): {}",
        long.join(", ")
    );
}

#[test]
fn every_root_name_is_read_from_lib_rs() {
    let parsed = root_names(
        "pub use dma_libfabric_sys as sys;\n#[cfg(feature = \"model\")]\npub use av::model::{AvEvent, ModelAv};\n\
         pub use error::DmaError;\npub use endpoint::{\n    Completion,\n    Segment,\n};\n",
    );
    let expected: Vec<(String, String)> = [
        ("sys", "sys"),
        ("AvEvent", "av"),
        ("ModelAv", "av"),
        ("DmaError", "error"),
        ("Completion", "endpoint"),
        ("Segment", "endpoint"),
    ]
    .iter()
    .map(|(name, module)| (name.to_string(), module.to_string()))
    .collect();
    assert_eq!(expected, parsed);
    let root = crate_root_names();
    assert!(
        root.len() >= 30,
        "lib.rs re-exports more than {}",
        root.len()
    );
    for (name, module) in &root {
        assert!(
            layer(module).is_some(),
            "{name} comes from `{module}`, which has no layer"
        );
    }
}

#[test]
fn the_length_check_counts_code_not_tests() {
    assert_eq!(
        2,
        code_lines("fn a() {}\nfn b() {}\n#[cfg(test)]\nmod tests {\n}\n")
    );
    assert_eq!(3, code_lines("fn a() {}\n#[cfg(test)]\nfn b() {}\n"));
    assert!(
        !LONGER
            .iter()
            .any(|(name, _)| name.starts_with("endpoint/mod"))
    );
}
