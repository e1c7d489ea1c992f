//! The crate root's public surface, checked in: `tests/public_surface.txt` lists every public
//! module and every name `lib.rs` re-exports, with the features it needs, so a change to what a
//! user can name at the root is a visible diff in review. After a deliberate change, run
//! `BLESS=1 cargo test --test public_surface` and commit the new list.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::path::Path;

/// `lib.rs`'s public items, one a line: `mod NAME`, or `use NAME from PATH`, each followed by
/// `[cfg: ...]` when an attribute gates it.
fn surface(lib: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut gate: Option<String> = None;
    let mut statement = String::new();
    for line in lib.lines() {
        let code = line.trim();
        if statement.is_empty() {
            if let Some(cfg) = code.strip_prefix("#[cfg(") {
                gate = Some(cfg.trim_end_matches(")]").to_string());
                continue;
            }
            if !(code.starts_with("pub mod ") || code.starts_with("pub use ")) {
                if !code.starts_with("#[") && !code.starts_with("///") {
                    gate = None;
                }
                continue;
            }
        }
        statement.push_str(code);
        statement.push(' ');
        if !code.ends_with(';') {
            continue;
        }
        let suffix = gate
            .take()
            .map_or(String::new(), |gate| format!(" [cfg: {gate}]"));
        let body = statement.trim().trim_end_matches(';').to_string();
        statement.clear();
        if let Some(name) = body.strip_prefix("pub mod ") {
            items.push(format!("mod {}{suffix}", name.trim()));
            continue;
        }
        let path = body.trim_start_matches("pub use ").trim();
        if let Some((from, alias)) = path.split_once(" as ") {
            items.push(format!("use {} from {}{suffix}", alias.trim(), from.trim()));
            continue;
        }
        match path.split_once('{') {
            Some((module, list)) => {
                for name in list.trim_end_matches('}').split(',') {
                    let name = name.trim();
                    if !name.is_empty() {
                        items.push(format!("use {name} from {module}{name}{suffix}"));
                    }
                }
            }
            None => {
                let name = path.rsplit("::").next().unwrap_or(path);
                items.push(format!("use {name} from {path}{suffix}"));
            }
        }
    }
    items
}

#[test]
fn the_public_surface_is_the_checked_in_list() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).expect("lib.rs");
    let now = surface(&lib).join("\n") + "\n";
    let listed_at = root.join("tests/public_surface.txt");
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&listed_at, &now).expect("write the list");
        return;
    }
    let listed = std::fs::read_to_string(&listed_at).expect("tests/public_surface.txt");
    assert!(
        listed == now,
        "the crate root's surface changed: review it, then run \
         `BLESS=1 cargo test --test public_surface` and commit tests/public_surface.txt.\n\
         listed:\n{listed}\nnow:\n{now}"
    );
}

#[test]
fn the_listing_reads_modules_uses_lists_aliases_and_gates() {
    let lib = "pub mod cache;\n#[cfg(feature = \"tokio\")]\npub mod asynchronous;\n\
               pub(crate) mod sync;\n/// Docs.\npub use dma_libfabric_sys as sys;\n\
               #[cfg(any(test, feature = \"model\"))]\npub use av::model::{AvEvent, ModelAv};\n\
               pub use endpoint::{\n    Completion,\n    Segment,\n};\npub use error::DmaError;\n";
    assert_eq!(
        vec![
            "mod cache",
            "mod asynchronous [cfg: feature = \"tokio\"]",
            "use sys from dma_libfabric_sys",
            "use AvEvent from av::model::AvEvent [cfg: any(test, feature = \"model\")]",
            "use ModelAv from av::model::ModelAv [cfg: any(test, feature = \"model\")]",
            "use Completion from endpoint::Completion",
            "use Segment from endpoint::Segment",
            "use DmaError from error::DmaError",
        ],
        surface(lib)
    );
}
