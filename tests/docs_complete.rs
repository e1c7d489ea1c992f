//! Every field of `Configuration` and `RxmSizing` says what it defaults to, and says the value
//! `Default` really gives it.
//!
//! The test reads the structs' source (`src/configuration.rs`, `src/configuration/rxm.rs`): each
//! `pub` field's doc comment needs a sentence with "Default" or "the default", and that sentence
//! must name the field's value in `Default::default()` (from the table below, built from the
//! values themselves). A new field without a default statement fails, and so does one missing
//! from the table, so that its value is checked too; a default that changes fails until its doc
//! says the new value.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::path::Path;
use std::time::Duration;

use dma_libfabric::{Configuration, ReceiveWindow, RxmSizing};

/// The `pub` fields of `pub struct NAME` in `source`, each with its doc comment's text (the
/// `///` lines above it, joined by spaces; blank doc lines as paragraph breaks).
fn fields(source: &str, name: &str) -> Vec<(String, String)> {
    let header = format!("pub struct {name} {{");
    let start = source
        .find(&header)
        .unwrap_or_else(|| panic!("`{header}` is in the source"));
    let mut found = Vec::new();
    let mut doc = String::new();
    for line in source[start + header.len()..].lines() {
        let line = line.trim();
        if line.starts_with('}') {
            break;
        }
        if let Some(text) = line.strip_prefix("///") {
            let text = text.trim();
            doc.push_str(if text.is_empty() { "\n\n" } else { text });
            doc.push(' ');
        } else if let Some(declaration) = line.strip_prefix("pub ") {
            let field = declaration
                .split(':')
                .next()
                .expect("a field has a name")
                .trim()
                .to_string();
            found.push((field, std::mem::take(&mut doc)));
        } else if !line.starts_with("#[") && !line.is_empty() {
            // A private field, or a comment: its doc does not carry over.
            doc.clear();
        }
    }
    found
}

/// The sentences of `doc` that state a default: those with "Default" or "the default" (any
/// case; "rxm's default" or "the provider's default" is someone else's default).
fn default_sentences(doc: &str) -> Vec<&str> {
    doc.split(". ")
        .flat_map(|sentence| sentence.split("\n\n"))
        .filter(|sentence| {
            sentence.contains("Default") || sentence.to_lowercase().contains("the default")
        })
        .collect()
}

/// `value` as a doc may write it: `4096` or `4,096`.
fn number(value: usize) -> Vec<String> {
    let digits = value.to_string();
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    vec![digits, grouped]
}

/// An optional size as a doc may write it: the number, or `None`.
fn optional(value: Option<usize>) -> Vec<String> {
    value.map_or_else(|| vec!["`None`".to_string()], number)
}

fn duration(value: Duration) -> Vec<String> {
    assert_eq!(0, value.subsec_nanos(), "whole seconds");
    vec![format!("{} s", value.as_secs())]
}

/// For each field, the ways its doc may write the value `Default` gives it (any one will do).
fn configuration_defaults() -> Vec<(&'static str, Vec<String>)> {
    let default = Configuration::default();
    vec![
        (
            "providers",
            vec![format!(
                "[{}]",
                default
                    .providers
                    .iter()
                    .map(|provider| format!("Provider::{provider:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )],
        ),
        (
            "bind",
            vec![
                default
                    .bind
                    .map_or("`None`".to_string(), |bind| format!("Some(\"{bind}\")")),
            ],
        ),
        ("av_capacity", number(default.av_capacity)),
        ("receive_buffers", number(default.receive_buffers)),
        ("receive_size", number(default.receive_size)),
        ("tx_size", vec![format!("{:?}", default.tx_size)]),
        ("rx_size", vec![format!("{:?}", default.rx_size)]),
        ("cq_size", number(default.cq_size)),
        ("rma", vec![format!("`{}`", default.rma)]),
        ("hmem", vec![format!("`{}`", default.hmem)]),
        (
            "rxm",
            if default.rxm == RxmSizing::default() {
                vec!["RxmSizing::default()".to_string()]
            } else {
                vec!["(the configuration's rxm is not RxmSizing::default())".to_string()]
            },
        ),
        ("cache_patience", duration(default.cache_patience)),
        ("busy_poll", vec![format!("`{}`", default.busy_poll)]),
        (
            "max_operations_per_peer",
            number(default.max_operations_per_peer),
        ),
        (
            "write_completion",
            vec![format!("WriteCompletion::{:?}", default.write_completion)],
        ),
        (
            "spin_before_sleep",
            vec![
                format!("{:?}", default.spin_before_sleep),
                "Duration::ZERO".to_string(),
            ],
        ),
        (
            "send_completion",
            vec![format!("SendCompletion::{:?}", default.send_completion)],
        ),
        (
            "peer_protocol",
            vec![format!("PeerProtocol::{:?}", default.peer_protocol)],
        ),
        (
            "receive_window",
            if default.receive_window == ReceiveWindow::default() {
                vec!["ReceiveWindow::default()".to_string()]
            } else {
                vec!["(the configuration's window is not ReceiveWindow::default())".to_string()]
            },
        ),
        (
            "receive_memory_limit",
            vec![format!("{} MiB", default.receive_memory_limit >> 20)],
        ),
    ]
}

fn rxm_defaults() -> Vec<(&'static str, Vec<String>)> {
    let default = RxmSizing::default();
    vec![
        ("buffer_size", optional(default.buffer_size)),
        ("tx_size", optional(default.tx_size)),
        ("rx_size", optional(default.rx_size)),
        ("msg_tx_size", optional(default.msg_tx_size)),
        ("msg_rx_size", optional(default.msg_rx_size)),
        (
            "use_srx",
            vec![
                default
                    .use_srx
                    .map_or("`None`".to_string(), |on| format!("{on:?}")),
            ],
        ),
    ]
}

/// What is wrong with the docs of `fields` against `defaults`: a field with no default
/// statement, one whose statement does not name its value, and one the table does not know.
fn faults(
    name: &str,
    fields: &[(String, String)],
    defaults: &[(&'static str, Vec<String>)],
) -> Vec<String> {
    let mut faults = Vec::new();
    for (field, doc) in fields {
        let sentences = default_sentences(doc);
        if sentences.is_empty() {
            faults.push(format!(
                "{name}::{field}: its doc states no default (no \"Default\" or \"the default\")"
            ));
            continue;
        }
        let Some((_, values)) = defaults.iter().find(|(known, _)| known == field) else {
            faults.push(format!(
                "{name}::{field}: not in this test's table of defaults; add its value there"
            ));
            continue;
        };
        if !sentences
            .iter()
            .any(|sentence| values.iter().any(|value| sentence.contains(value.as_str())))
        {
            faults.push(format!(
                "{name}::{field}: its default is {values:?}, which its doc's default statement \
                 does not name: {sentences:?}"
            ));
        }
    }
    for (known, _) in defaults {
        if !fields.iter().any(|(field, _)| field == known) {
            faults.push(format!(
                "{name}::{known}: in this test's table, but not a pub field"
            ));
        }
    }
    faults
}

fn source(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative))
        .unwrap_or_else(|error| panic!("{relative}: {error}"))
}

#[test]
fn every_configuration_field_states_its_default() {
    let configuration = fields(&source("src/configuration.rs"), "Configuration");
    let rxm = fields(&source("src/configuration/rxm.rs"), "RxmSizing");
    assert!(
        configuration.len() >= 15 && rxm.len() >= 6,
        "the scan found {} and {} fields: is it broken?",
        configuration.len(),
        rxm.len()
    );
    let mut found = faults("Configuration", &configuration, &configuration_defaults());
    found.extend(faults("RxmSizing", &rxm, &rxm_defaults()));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_check_rejects_a_missing_or_wrong_default() {
    let source = "pub struct Sample {
        /// A size. Default 4,096.
        pub good: usize,
        /// A size, as rxm's default.
        pub unstated: usize,
        /// A depth. Default 512.
        pub wrong: usize,
        // not a doc
        private: usize,
        /// Not in the table. The default is 1.
        pub unknown: usize,
    }";
    let sample = fields(source, "Sample");
    assert_eq!(
        vec!["good", "unstated", "wrong", "unknown"],
        sample
            .iter()
            .map(|(field, _)| field.as_str())
            .collect::<Vec<_>>()
    );
    let table = vec![
        ("good", number(4096)),
        ("unstated", number(1)),
        ("wrong", number(256)),
        ("gone", number(1)),
    ];
    let found = faults("Sample", &sample, &table);
    assert_eq!(4, found.len(), "{found:#?}");
    assert!(found[0].starts_with("Sample::unstated: its doc states no default"));
    assert!(found[1].starts_with("Sample::wrong: its default is"));
    assert!(found[2].starts_with("Sample::unknown: not in this test's table"));
    assert!(found[3].starts_with("Sample::gone: in this test's table"));
}
