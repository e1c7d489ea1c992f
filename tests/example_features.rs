//! Every example runs with the default features, or declares the ones it needs.
//!
//! An example that uses an item behind one of the crate's features (the `asynchronous` module,
//! feature `tokio`) does not compile without it; with `required-features` in its `[[example]]`
//! entry, `cargo run --example NAME` says instead which `--features` to add. The test finds the
//! gated items in `src/` (each `pub` item or `impl` under `#[cfg(feature = "…")]`), reads every
//! example's code (`examples/NAME.rs` with its module folder `examples/NAME/`, and
//! `examples/NAME/main.rs`), and checks that each feature an example uses is in its
//! `required-features`, unless the crate's dev-dependency on itself turns the feature on for
//! every example anyway (`model`, `memmap2`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// An example as the manifest and the folder give it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Example {
    name: String,
    /// The main file, relative to the root.
    path: String,
    required_features: Vec<String>,
}

/// The strings of a one-line TOML array: `["a", "b"]`.
fn strings(array: &str) -> Vec<String> {
    array
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|item| item.trim().trim_matches('"').to_string())
        .filter(|item| !item.is_empty())
        .collect()
}

/// The value of `key = value` on `line`, if that is its key.
fn value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let (name, value) = line.split_once('=')?;
    (name.trim() == key).then(|| value.trim())
}

/// What the manifest says: its `[[example]]` entries (by name), the features of `[features]`,
/// and the features the dev-dependency on the crate itself turns on.
fn manifest(text: &str) -> (Vec<Example>, BTreeSet<String>, BTreeSet<String>) {
    let mut examples: Vec<Example> = Vec::new();
    let mut features = BTreeSet::new();
    let mut always = BTreeSet::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') && !line.contains('=') {
            section = line.to_string();
            if section == "[[example]]" {
                examples.push(Example::default());
            }
            continue;
        }
        match section.as_str() {
            "[[example]]" => {
                let example = examples.last_mut().expect("inside an [[example]]");
                if let Some(name) = value(line, "name") {
                    example.name = name.trim_matches('"').to_string();
                } else if let Some(path) = value(line, "path") {
                    example.path = path.trim_matches('"').to_string();
                } else if let Some(required) = value(line, "required-features") {
                    example.required_features = strings(required);
                }
            }
            "[features]" => {
                if let Some((name, _)) = line.split_once('=')
                    && !line.starts_with('#')
                {
                    features.insert(name.trim().to_string());
                }
            }
            "[dev-dependencies]" => {
                if let Some(dependency) = value(line, "dma-libfabric")
                    && let Some((_, list)) = dependency.split_once("features")
                {
                    let list = list.trim_start().trim_start_matches('=');
                    let list = &list[..list.find(']').map_or(list.len(), |end| end + 1)];
                    always.extend(strings(list));
                }
            }
            _ => {}
        }
    }
    for example in &mut examples {
        if example.path.is_empty() {
            example.path = format!("examples/{}.rs", example.name);
        }
    }
    (examples, features, always)
}

/// Every example: the manifest's, and those cargo finds by itself (`examples/NAME.rs`,
/// `examples/NAME/main.rs`) with no entry, which then require nothing.
fn examples(root: &Path, declared: Vec<Example>) -> Vec<Example> {
    let mut all = declared;
    let mut entries: Vec<_> = std::fs::read_dir(root.join("examples"))
        .expect("examples/ exists")
        .flatten()
        .map(|entry| entry.path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let main = if path.is_dir() {
            path.join("main.rs")
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            path.clone()
        } else {
            continue;
        };
        if !main.is_file() {
            continue; // a module folder, as `examples/churn/` is `churn.rs`'s
        }
        if !all.iter().any(|example| example.name == name) {
            all.push(Example {
                name,
                path: main
                    .strip_prefix(root)
                    .expect("under the root")
                    .to_string_lossy()
                    .into_owned(),
                required_features: Vec::new(),
            });
        }
    }
    all
}

/// `text` without its `//` comments (doc comments included): what compiles.
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.split_once("//").map_or(line, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `.rs` file under `folder`, recursively.
fn rust_files(folder: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(folder) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(rust_files(&path));
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push(path);
        }
    }
    found
}

/// The code of an example: its main file and its module folder.
fn example_code(root: &Path, example: &Example) -> String {
    let main = root.join(&example.path);
    let folder = if main.file_name().is_some_and(|name| name == "main.rs") {
        main.parent().expect("a folder").to_path_buf()
    } else {
        main.with_extension("")
    };
    let mut files = vec![main.clone()];
    files.extend(rust_files(&folder).into_iter().filter(|file| *file != main));
    files
        .iter()
        .map(|file| code(&std::fs::read_to_string(file).expect("an example is readable")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The feature a `#[cfg(…)]` line gates on, if it gates on one: `feature = "x"` alone or with
/// `test` (`any(test, feature = "x")`); `not(…)` is not a gate.
fn gate(line: &str) -> Option<String> {
    let condition = line.strip_prefix("#[cfg(")?;
    if condition.contains("not(") {
        return None;
    }
    let (_, rest) = condition.split_once("feature = \"")?;
    rest.split_once('"').map(|(feature, _)| feature.to_string())
}

/// The names an item declaration gives the code that uses it: `pub mod x;` gives `x`,
/// `pub use a::{B, C};` gives `B` and `C`, `pub fn f(` gives `f`, `pub struct S` gives `S`, and
/// `impl T for a::S {` gives `S` (using the type is what needs the impl).
fn declared_names(line: &str) -> Vec<String> {
    let word = |text: &str| {
        text.split(|letter: char| !(letter.is_alphanumeric() || letter == '_'))
            .next()
            .unwrap_or("")
            .to_string()
    };
    let line = line.trim();
    if let Some((_, target)) = line
        .strip_prefix("unsafe ")
        .unwrap_or(line)
        .strip_prefix("impl")
        .and_then(|rest| rest.split_once(" for "))
    {
        let path = target.split([' ', '{', '<']).next().unwrap_or("");
        return vec![path.rsplit("::").next().unwrap_or("").to_string()];
    }
    let Some(item) = line.strip_prefix("pub ") else {
        return Vec::new();
    };
    if let Some(used) = item.strip_prefix("use ") {
        let used = used.trim_end_matches(';');
        return match used.split_once('{') {
            Some((_, list)) => list
                .trim_end_matches('}')
                .split(',')
                .map(|name| name.trim().rsplit("::").next().unwrap_or("").to_string())
                .filter(|name| !name.is_empty())
                .collect(),
            None => vec![used.rsplit("::").next().unwrap_or("").to_string()],
        };
    }
    for kind in [
        "mod ", "fn ", "struct ", "enum ", "trait ", "const ", "type ",
    ] {
        if let Some(rest) = item.strip_prefix(kind) {
            return vec![word(rest)];
        }
    }
    Vec::new()
}

/// The crate's feature-gated names, by feature, in the source text of its files.
fn gated<'a>(sources: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, BTreeSet<String>> {
    let mut gated: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for source in sources {
        let lines: Vec<&str> = source.lines().map(str::trim).collect();
        for (index, line) in lines.iter().enumerate() {
            let Some(feature) = gate(line) else {
                continue;
            };
            // The item under the gate: past further attributes, comments and docs.
            let Some(item) = lines[index + 1..]
                .iter()
                .find(|next| !(next.starts_with("#[") || next.starts_with("//")))
            else {
                continue;
            };
            gated
                .entry(feature)
                .or_default()
                .extend(declared_names(item));
        }
    }
    gated
}

/// Whether `code` uses `name` as a word.
fn uses(code: &str, name: &str) -> bool {
    code.match_indices(name).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + name.len()..].chars().next();
        let boundary = |letter: Option<char>| {
            letter.is_none_or(|letter| !(letter.is_alphanumeric() || letter == '_'))
        };
        boundary(before) && boundary(after)
    })
}

/// What is wrong: an example that uses a gated name without requiring its feature (unless
/// every example has it), or that requires a feature the crate does not have.
fn faults(
    examples: &[(Example, String)],
    gated: &BTreeMap<String, BTreeSet<String>>,
    features: &BTreeSet<String>,
    always: &BTreeSet<String>,
) -> Vec<String> {
    let mut faults = Vec::new();
    for (example, code) in examples {
        for required in &example.required_features {
            if !features.contains(required) {
                faults.push(format!(
                    "example {} requires `{required}`, which is not a feature",
                    example.name
                ));
            }
        }
        for (feature, names) in gated {
            if always.contains(feature) || example.required_features.contains(feature) {
                continue;
            }
            let used: Vec<&String> = names.iter().filter(|name| uses(code, name)).collect();
            if !used.is_empty() {
                faults.push(format!(
                    "example {} uses {used:?} (feature `{feature}`) but its [[example]] entry \
                     does not have required-features = [\"{feature}\"]",
                    example.name
                ));
            }
        }
    }
    faults
}

#[test]
fn every_example_declares_the_features_it_needs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("Cargo.toml")).expect("the manifest");
    let (declared, features, always) = manifest(&text);
    for example in &declared {
        assert!(
            root.join(&example.path).is_file(),
            "[[example]] {} names {}, which is not there",
            example.name,
            example.path
        );
    }
    let all = examples(root, declared);
    let sources: Vec<String> = rust_files(&root.join("src"))
        .iter()
        .map(|file| std::fs::read_to_string(file).expect("a source file"))
        .collect();
    let gated = gated(sources.iter().map(String::as_str));
    // The scan sees what it must, or it checks nothing.
    assert!(
        gated
            .get("tokio")
            .is_some_and(|names| names.contains("asynchronous")),
        "{gated:?}"
    );
    assert!(
        gated
            .get("model")
            .is_some_and(|names| names.contains("ModelAv")),
        "{gated:?}"
    );
    assert!(
        gated
            .get("memmap2")
            .is_some_and(|names| names.contains("MmapMut")),
        "{gated:?}"
    );
    assert!(all.len() >= 6, "{all:?}");
    assert!(
        always.contains("model") && !always.contains("tokio"),
        "{always:?}"
    );
    let with_code: Vec<(Example, String)> = all
        .into_iter()
        .map(|example| {
            let code = example_code(root, &example);
            (example, code)
        })
        .collect();
    assert!(
        with_code
            .iter()
            .any(|(example, code)| example.name == "tokio_server" && uses(code, "asynchronous")),
        "tokio_server's code is read"
    );
    let found = faults(&with_code, &gated, &features, &always);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_check_finds_an_example_without_its_features() {
    let manifest_text = r#"
[features]
default = []
## The async API.
tokio = ["dep:tokio"]
model = []

[dev-dependencies]
dma-libfabric = { path = ".", features = ["model"] }

[[example]]
name = "declared"
required-features = ["tokio"]

[[example]]
name = "forgot"

[[example]]
name = "misspelt"
path = "examples/misspelt/main.rs"
required-features = ["tokyo"]
"#;
    let (declared, features, always) = manifest(manifest_text);
    assert_eq!(
        vec![
            "examples/declared.rs",
            "examples/forgot.rs",
            "examples/misspelt/main.rs"
        ],
        declared
            .iter()
            .map(|example| example.path.as_str())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        BTreeSet::from(["default".to_string(), "model".into(), "tokio".into()]),
        features
    );
    assert_eq!(BTreeSet::from(["model".to_string()]), always);
    let source = "#[cfg(feature = \"tokio\")]\n// docs\npub mod asynchronous;\n\
        #[cfg(any(test, feature = \"model\"))]\npub use av::model::{AvEvent, ModelAv};\n\
        #[cfg(feature = \"memmap2\")]\n// SAFETY: …\nunsafe impl StableBuffer for memmap2::MmapMut {\n\
        #[cfg(not(feature = \"tokio\"))]\npub fn fallback() {}\n";
    let gated = gated([source]);
    assert_eq!(
        BTreeMap::from([
            (
                "memmap2".to_string(),
                BTreeSet::from(["MmapMut".to_string()])
            ),
            (
                "model".to_string(),
                BTreeSet::from(["AvEvent".to_string(), "ModelAv".into()])
            ),
            (
                "tokio".to_string(),
                BTreeSet::from(["asynchronous".to_string()])
            ),
        ]),
        gated
    );
    let async_code = code(
        "use dma_libfabric::asynchronous::AsyncEndpoint; // and ModelAv, in a comment\n\
         let model = dma_libfabric::ModelAv::new();",
    );
    let examples: Vec<(Example, String)> = declared
        .into_iter()
        .map(|example| (example, async_code.clone()))
        .collect();
    let found = faults(&examples, &gated, &features, &always);
    assert_eq!(3, found.len(), "{found:#?}");
    assert!(
        found[0].starts_with("example forgot uses [\"asynchronous\"] (feature `tokio`)"),
        "{}",
        found[0]
    );
    assert!(found[1].contains("requires `tokyo`, which is not a feature"));
    assert!(found[2].starts_with("example misspelt uses [\"asynchronous\"]"));
    assert!(!uses("asynchronously", "asynchronous"));
}
