//! The library's modules depend on each other one way, bottom up:
//! `error`/`sync` → `address`/`configuration` → `av` → `cache` → `endpoint` → `rails` →
//! `asynchronous`.
//!
//! Read from the source: every `crate::…` path in code (doc comments aside, which may link
//! anywhere) must name a module at or below the one it is written in. Names re-exported at the
//! crate root count as the module they come from. (`super::` never leaves a top-level module
//! here: each is a directory whose files reach their siblings through it.)
//!
//! And no file under `src/` is longer than a reader keeps in their head: see [`MOST_LINES`].
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

/// The most lines a file under `src/` may hold, docs and tests included: about what a reader
/// keeps in their head at once.
const MOST_LINES: usize = 600;

/// Files allowed past [`MOST_LINES`], and why.
const LONGER: &[(&str, &str)] = &[];

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
        let lines = std::fs::read_to_string(file).expect("read").lines().count();
        if lines > MOST_LINES && !LONGER.iter().any(|(longer, _)| *longer == name) {
            long.push(format!("{name}: {lines} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "split these along their seams (or name them in LONGER, with why): {}",
        long.join(", ")
    );
    let stale: Vec<&str> = LONGER
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| {
            let text = std::fs::read_to_string(Path::new("src").join(name)).unwrap_or_default();
            text.lines().count() <= MOST_LINES
        })
        .collect();
    assert!(
        stale.is_empty(),
        "no longer long, take them off LONGER: {stale:?}"
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
fn the_code_scan_stops_at_the_tests() {
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

/// Every file under `src/` with its module path (`cache/writer/mod.rs` is `cache::writer`).
fn modules() -> Vec<(String, Vec<String>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    files
        .iter()
        .map(|file| {
            let relative = file
                .strip_prefix(&root)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/");
            let mut path: Vec<String> = relative
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_string)
                .collect();
            if path
                .last()
                .is_some_and(|last| last == "mod" || last == "lib")
            {
                path.pop();
            }
            (relative, path)
        })
        .collect()
}

/// The lines of `text` that are code: comments, doc comments included, and the test module left
/// out (a test module may reach anywhere).
fn code_of(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = code_lines(text);
    lines[..end]
        .iter()
        .map(|line| line.trim_start())
        .filter(|line| !line.starts_with("//"))
        .collect()
}

/// The module paths a file's code names, absolute: `crate::a::b` and `super::c` (resolved
/// against the file's own module `own`), as far as the path's words go.
fn paths_named(code: &str, own: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let words = |rest: &str| -> Vec<String> {
        let mut words = Vec::new();
        let mut rest = rest;
        loop {
            let word: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if word.is_empty() {
                break;
            }
            rest = &rest[word.len()..];
            words.push(word);
            match rest.strip_prefix("::") {
                Some(next) => rest = next,
                None => break,
            }
        }
        words
    };
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        found.push(words(&code[at + "crate::".len()..]));
    }
    for (at, _) in code.match_indices("super::") {
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut base: Vec<String> = own.to_vec();
        let mut rest = &code[at..];
        while let Some(next) = rest.strip_prefix("super::") {
            base.pop();
            rest = next;
        }
        base.extend(words(rest));
        found.push(base);
    }
    found
}

/// The import graph between files: an edge from each file to the file of every module its code
/// names, leaving out a module's own room (its ancestors, reached through `super::`, and its
/// descendants), which is one unit with it.
fn import_edges() -> Vec<(String, String)> {
    let modules = modules();
    let file_of = |path: &[String]| -> Option<&String> {
        (0..=path.len()).rev().find_map(|len| {
            modules
                .iter()
                .find(|(_, module)| module.as_slice() == &path[..len])
                .map(|(file, _)| file)
        })
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut edges = Vec::new();
    for (file, own) in &modules {
        let text = std::fs::read_to_string(root.join(file)).expect("read");
        for line in code_of(&text) {
            for path in paths_named(line, own) {
                let Some(target) = file_of(&path) else {
                    continue;
                };
                let target_module = &modules
                    .iter()
                    .find(|(name, _)| name == target)
                    .expect("a file")
                    .1;
                let related = own.starts_with(target_module) || target_module.starts_with(own);
                if target != file && !related && !edges.contains(&(file.clone(), target.clone())) {
                    edges.push((file.clone(), target.clone()));
                }
            }
        }
    }
    edges
}

/// The files that import each other, directly or round a loop: each strongly connected set of
/// more than one file, sorted.
fn import_circles(edges: &[(String, String)]) -> Vec<Vec<String>> {
    let mut files: Vec<&String> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
    files.sort();
    files.dedup();
    let reaches = |from: &String, to: &String| -> bool {
        let mut seen = vec![from];
        let mut stack = vec![from];
        while let Some(at) = stack.pop() {
            for (a, b) in edges {
                if a == at && !seen.contains(&b) {
                    if b == to {
                        return true;
                    }
                    seen.push(b);
                    stack.push(b);
                }
            }
        }
        false
    };
    let mut circles: Vec<Vec<String>> = Vec::new();
    for file in &files {
        if circles.iter().any(|circle| circle.contains(file)) {
            continue;
        }
        let mut circle: Vec<String> = files
            .iter()
            .filter(|other| *other == file || (reaches(file, other) && reaches(other, file)))
            .map(|other| (*other).clone())
            .collect();
        if circle.len() > 1 {
            circle.sort();
            circles.push(circle);
        }
    }
    circles
}

/// No two files import each other, directly or round a loop: the picture drawn from the imports
/// has no circle, so each file can be read after the ones it uses.
///
/// The circles still in the tree are listed in [`KNOWN_CIRCLES`]: a new one fails, and so does a
/// listed one that has gone (take it off the list), so the list only shrinks.
#[test]
fn no_two_files_import_each_other() {
    let edges = import_edges();
    assert!(edges.len() > 40, "the scan found {} imports", edges.len());
    let circles = import_circles(&edges);
    let known: Vec<Vec<String>> = KNOWN_CIRCLES
        .iter()
        .map(|circle| circle.iter().map(|file| (*file).to_string()).collect())
        .collect();
    let new: Vec<&Vec<String>> = circles.iter().filter(|c| !known.contains(c)).collect();
    let gone: Vec<&Vec<String>> = known.iter().filter(|c| !circles.contains(c)).collect();
    assert!(new.is_empty(), "files that import each other: {new:?}");
    assert!(
        gone.is_empty(),
        "no longer circles, take them off KNOWN_CIRCLES: {gone:?}"
    );
}

/// The circles of imports the tree still has, to be broken (issue "One public face"): none.
const KNOWN_CIRCLES: &[&[&str]] = &[];

/// No file but `lib.rs` reaches a layer through the crate root: not `crate::sys` (each layer uses
/// `dma_libfabric_sys` itself), and not `crate::Name` of a root re-export, in code or in a doc
/// link, so the root is the top of the picture, not a hub in its middle.
#[test]
fn no_file_but_lib_rs_names_a_path_through_the_crate_root() {
    let root_names = crate_root_names();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut through_root = Vec::new();
    for (file, _) in modules() {
        if file == "lib.rs" {
            continue;
        }
        let text = std::fs::read_to_string(root.join(&file)).expect("read");
        for (number, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices("crate::") {
                let rest = &line[at + "crate::".len()..];
                // `crate::Name`, or each name of `crate::{a::B, Name}` (on this line).
                let names: Vec<String> = match rest.strip_prefix('{') {
                    Some(list) => list
                        .split('}')
                        .next()
                        .unwrap_or("")
                        .split(',')
                        .map(|part| part.trim().split("::").next().unwrap_or("").to_string())
                        .collect(),
                    None => vec![
                        rest.chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect(),
                    ],
                };
                for name in names {
                    if root_names.iter().any(|(exported, _)| *exported == name) {
                        through_root.push(format!("{file}:{}: crate::{name}", number + 1));
                    }
                }
            }
        }
    }
    assert!(
        through_root.is_empty(),
        "name the layer's own path (`crate::cache::Lease`, `dma_libfabric_sys`):\n{}",
        through_root.join("\n")
    );
}

#[test]
fn the_import_scan_finds_circles_and_paths() {
    let own = vec!["cache".to_string(), "writer".to_string()];
    assert_eq!(
        vec![
            vec![
                "cache".to_string(),
                "lease".to_string(),
                "Lease".to_string()
            ],
            vec!["cache".to_string(), "Core".to_string()],
        ],
        paths_named("use crate::cache::lease::Lease; let _ = super::Core;", &own)
    );
    let edge = |a: &str, b: &str| (a.to_string(), b.to_string());
    let edges = vec![
        edge("a.rs", "b.rs"),
        edge("b.rs", "c.rs"),
        edge("c.rs", "a.rs"),
        edge("c.rs", "d.rs"),
    ];
    assert_eq!(
        vec![vec![
            "a.rs".to_string(),
            "b.rs".to_string(),
            "c.rs".to_string()
        ]],
        import_circles(&edges)
    );
    assert!(import_circles(&edges[..2]).is_empty());
}

/// The files that hold `impl LibfabricEndpoint` blocks: its faces (`ARCHITECTURE.md`, "The
/// engine and its faces"). What they call is module functions or methods of the parts.
const ENDPOINT_FACES: usize = 6;

#[test]
fn the_endpoints_methods_live_in_its_faces_alone() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let faces: Vec<String> = files
        .iter()
        .filter(|file| {
            std::fs::read_to_string(file)
                .expect("read")
                .contains("impl LibfabricEndpoint {")
        })
        .map(|file| {
            file.strip_prefix(&root)
                .expect("under src")
                .display()
                .to_string()
        })
        .collect();
    assert!(
        faces.len() <= ENDPOINT_FACES,
        "`impl LibfabricEndpoint` in {} files (at most {ENDPOINT_FACES}): {faces:?}",
        faces.len()
    );
}

/// The most fields one struct of the writer holds: each part has one job (`cache/writer/mod.rs`).
const MOST_WRITER_FIELDS: usize = 12;

/// The named fields of each `struct … {` in `text`: (name, count).
fn struct_fields(text: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut current: Option<(String, usize)> = None;
    for line in text.lines() {
        match &mut current {
            None => {
                let trimmed = match line.strip_prefix("pub(") {
                    Some(rest) => rest.split_once(") ").map_or(rest, |(_, after)| after),
                    None => line.trim_start_matches("pub "),
                };
                if let Some(rest) = trimmed.strip_prefix("struct ") {
                    if line.ends_with('{') {
                        let name = rest.split(['<', ' ', '(']).next().unwrap_or("").to_string();
                        current = Some((name, 0));
                    }
                }
            }
            Some((name, count)) => {
                if line == "}" {
                    found.push((std::mem::take(name), *count));
                    current = None;
                } else {
                    let field = line.trim_start();
                    let field = field.split_once(") ").map_or(field, |(_, rest)| rest);
                    let field = field.trim_start_matches("pub ");
                    let named = field.split_once(':').is_some_and(|(name, _)| {
                        name.chars().all(|c| c.is_alphanumeric() || c == '_')
                    });
                    if line.starts_with("    ")
                        && !line.starts_with("     ")
                        && named
                        && !field.starts_with("//")
                    {
                        *count += 1;
                    }
                }
            }
        }
    }
    found
}

#[test]
fn no_part_of_the_writer_holds_more_than_twelve_fields() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cache/writer");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut wide = Vec::new();
    let mut writer_seen = false;
    for file in &files {
        for (name, fields) in struct_fields(&std::fs::read_to_string(file).expect("read")) {
            writer_seen |= "Writer" == name && fields > 0;
            if fields > MOST_WRITER_FIELDS {
                wide.push(format!("{}: {name} has {fields}", file.display()));
            }
        }
    }
    assert!(
        writer_seen,
        "the scan found no `Writer` struct: it reads nothing"
    );
    assert!(wide.is_empty(), "split these: {wide:?}");
}

#[test]
fn the_field_count_counts_named_fields() {
    let text = "pub(super) struct Writer<B> {\n    /// docs\n    backend: B,\n    pub(crate) shared: Arc<S>,\n    #[allow(x)]\n    tick: u64,\n}\n";
    assert_eq!(vec![("Writer".to_string(), 3)], struct_fields(text));
}
