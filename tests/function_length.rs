//! No function is longer than a reader follows at once: none under `src/` over
//! [`SRC_LIMIT`] lines, none under `examples/` (what users copy) over [`EXAMPLES_LIMIT`].
//!
//! A function's length is its lines from the one with `fn` to the one with its closing brace,
//! both counted (its doc comment and attributes are not). Functions nested in another count on
//! their own, and inside the one that holds them. The scanner is a small lexer, not a parser:
//! it blanks out comments (nested block comments too), string literals (raw, byte and C strings
//! included) and char literals (told apart from lifetimes), then matches braces. A `fn` item
//! without a body (a trait's declaration) has no length.
//!
//! Functions still over their limit that other work is splitting are listed in [`PENDING`]: a
//! new long function fails, and so does a listed one that is now short (take it off the list),
//! so the list only shrinks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::path::{Path, PathBuf};

/// The most lines a function under `src/` may span.
const SRC_LIMIT: usize = 100;
/// The most lines a function under `examples/` may span.
const EXAMPLES_LIMIT: usize = 150;

/// Functions allowed past their limit for now, as `(file, function)`: each is being split on
/// another branch.
const PENDING: &[(&str, &str)] = &[];

/// One function found: its name, the line its `fn` is on (from 1), and how many lines it spans.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Function {
    name: String,
    line: usize,
    lines: usize,
}

/// `text` with every comment, string literal and char literal replaced by spaces (newlines
/// kept), so that the braces, parentheses and `fn`s left are code.
fn code_only(text: &str) -> Vec<char> {
    let source: Vec<char> = text.chars().collect();
    let mut code = source.clone();
    let blank = |code: &mut Vec<char>, from: usize, to: usize| {
        for c in &mut code[from..to.min(source.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut at = 0;
    while at < source.len() {
        let rest = &source[at..];
        let prefix_allowed = at == 0 || !ident(source[at - 1]);
        let raw = if prefix_allowed {
            raw_string_len(rest)
        } else {
            None
        };
        let (len, literal) = if rest.starts_with(&['/', '/']) {
            (
                rest.iter().position(|&c| c == '\n').unwrap_or(rest.len()),
                true,
            )
        } else if rest.starts_with(&['/', '*']) {
            (block_comment_len(rest), true)
        } else if let Some(len) = raw {
            (len, true)
        } else if rest[0] == '"' {
            (quoted_len(rest, '"'), true)
        } else if prefix_allowed && matches!(rest, ['b' | 'c', '"', ..]) {
            (1 + quoted_len(&rest[1..], '"'), true)
        } else if rest[0] == '\'' {
            // `None`: a lifetime or a label, which is code.
            char_literal_len(rest).map_or((1, false), |len| (len, true))
        } else if prefix_allowed && matches!(rest, ['b', '\'', ..]) {
            char_literal_len(&rest[1..]).map_or((1, false), |len| (1 + len, true))
        } else {
            (1, false)
        };
        if literal {
            blank(&mut code, at, at + len);
        }
        at += len.max(1);
    }
    code
}

/// The length of the block comment `text` starts with, nested comments included.
fn block_comment_len(text: &[char]) -> usize {
    let mut depth = 0;
    let mut at = 0;
    while at < text.len() {
        if text[at..].starts_with(&['/', '*']) {
            depth += 1;
            at += 2;
        } else if text[at..].starts_with(&['*', '/']) {
            depth -= 1;
            at += 2;
            if 0 == depth {
                return at;
            }
        } else {
            at += 1;
        }
    }
    text.len()
}

/// The length of the raw string (`r"…"`, `r#"…"#`, `br"…"`, `cr#"…"#`) `text` starts with, if
/// it starts with one.
fn raw_string_len(text: &[char]) -> Option<usize> {
    let after_prefix = match text {
        ['r', ..] => 1,
        ['b' | 'c', 'r', ..] => 2,
        _ => return None,
    };
    let hashes = text[after_prefix..]
        .iter()
        .take_while(|&&c| c == '#')
        .count();
    let open = after_prefix + hashes;
    if text.get(open) != Some(&'"') {
        return None;
    }
    let closing: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    let body = &text[open + 1..];
    let end = (0..body.len())
        .find(|&at| body[at..].starts_with(&closing))
        .map_or(text.len(), |at| open + 1 + at + closing.len());
    Some(end)
}

/// The length of the literal quoted with `quote` that `text` starts with (at the quote),
/// escapes included.
fn quoted_len(text: &[char], quote: char) -> usize {
    let mut at = 1;
    while at < text.len() {
        match text[at] {
            '\\' => at += 2,
            c if c == quote => return at + 1,
            _ => at += 1,
        }
    }
    text.len()
}

/// The length of the char literal `text` starts with (at its quote), or `None` when the quote
/// begins a lifetime or a label (`'a`, `'static`, `'outer:`).
fn char_literal_len(text: &[char]) -> Option<usize> {
    match text {
        ['\'', '\\', ..] => Some(quoted_len(text, '\'')),
        ['\'', _, '\'', ..] => Some(3),
        _ => None,
    }
}

/// Every function with a body in `text`.
fn functions(text: &str) -> Vec<Function> {
    let code = code_only(text);
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    // The line each char is on, from 1.
    let lines: Vec<usize> = code
        .iter()
        .scan(1, |line, &c| {
            let this = *line;
            *line += usize::from(c == '\n');
            Some(this)
        })
        .collect();
    let line_of = |at: usize| lines[at];
    let mut found = Vec::new();
    let mut at = 0;
    while at + 2 < code.len() {
        let is_fn = code[at..].starts_with(&['f', 'n'])
            && (at == 0 || !ident(code[at - 1]))
            && code[at + 2].is_whitespace();
        if !is_fn {
            at += 1;
            continue;
        }
        let name_at = at
            + 2
            + code[at + 2..]
                .iter()
                .take_while(|c| c.is_whitespace())
                .count();
        let name: String = code[name_at..].iter().take_while(|&&c| ident(c)).collect();
        if name.is_empty() {
            // `fn(u8) -> u8`, a pointer type, or `fn $name` in a macro: not an item here.
            at += 2;
            continue;
        }
        if let Some(close) = body_end(&code, name_at + name.len()) {
            found.push(Function {
                name,
                line: line_of(at),
                lines: line_of(close) - line_of(at) + 1,
            });
        }
        at = name_at;
    }
    found
}

/// Where the body of the function whose signature goes on from `from` closes: the brace that
/// matches the first `{` outside parentheses, brackets and generic arguments (a const argument
/// `Foo<{ N }>` is not the body; the `>` of `->` closes nothing). `None` for a declaration (a
/// `;` first) or a body never closed.
fn body_end(code: &[char], from: usize) -> Option<usize> {
    let mut nesting = 0_usize;
    let mut at = from;
    while at < code.len() {
        match code[at] {
            '(' | '[' | '<' => nesting += 1,
            '>' if at > 0 && code[at - 1] == '-' => {}
            ')' | ']' | '>' => nesting = nesting.saturating_sub(1),
            ';' if 0 == nesting => return None,
            '{' if 0 == nesting => break,
            _ => {}
        }
        at += 1;
    }
    let mut depth = 0_usize;
    for (offset, &c) in code[at..].iter().enumerate() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if 0 == depth {
                    return Some(at + offset);
                }
            }
            _ => {}
        }
    }
    None
}

/// Every `.rs` file under `dir`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Every function under the crate's `folder` over `limit` lines, as `(file, function)` with
/// its line and length.
fn longer_than(folder: &str, limit: usize) -> Vec<Long> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    for file in sources(&root.join(folder)) {
        let name = file
            .strip_prefix(root)
            .expect("under the crate")
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for function in functions(&text) {
            if function.lines > limit {
                long.push(((name.clone(), function.name.clone()), function));
            }
        }
    }
    long
}

/// A long function found: `(file, function)` and what was measured.
type Long = ((String, String), Function);

/// Of the `long` functions, those not in `pending` (each named with its place and length), and
/// the `pending` ones no longer long.
fn unexpected(long: &[Long], pending: &[(&str, &str)]) -> (Vec<String>, Vec<String>) {
    let new = long
        .iter()
        .filter(|((file, name), _)| !pending.contains(&(file.as_str(), name.as_str())))
        .map(|((file, name), function)| {
            format!("{file}:{} {name}: {} lines", function.line, function.lines)
        })
        .collect();
    let done = pending
        .iter()
        .filter(|(file, name)| {
            !long
                .iter()
                .any(|((long_file, long_name), _)| long_file == file && long_name == name)
        })
        .map(|(file, name)| format!("{file} {name}"))
        .collect();
    (new, done)
}

#[test]
fn no_function_is_longer_than_its_limit() {
    let long: Vec<Long> = longer_than("src", SRC_LIMIT)
        .into_iter()
        .chain(longer_than("examples", EXAMPLES_LIMIT))
        .collect();
    let (new, done) = unexpected(&long, PENDING);
    assert!(
        new.is_empty(),
        "split these into named steps (src/ at most {SRC_LIMIT} lines, examples/ at most \
         {EXAMPLES_LIMIT}):\n{}",
        new.join("\n")
    );
    assert!(
        done.is_empty(),
        "no longer over the limit: take these off PENDING: {}",
        done.join(", ")
    );
}

#[test]
fn a_new_long_function_and_a_pending_one_made_short_are_both_named() {
    let long = |file: &str, name: &str| -> Long {
        (
            (file.into(), name.into()),
            Function {
                name: name.into(),
                line: 7,
                lines: 120,
            },
        )
    };
    let found = [long("src/a.rs", "still_long"), long("src/b.rs", "new_long")];
    let pending = [("src/a.rs", "still_long"), ("src/c.rs", "now_short")];
    let (new, done) = unexpected(&found, &pending);
    assert_eq!(vec!["src/b.rs:7 new_long: 120 lines".to_string()], new);
    assert_eq!(vec!["src/c.rs now_short".to_string()], done);
    assert_eq!(
        (Vec::<String>::new(), Vec::<String>::new()),
        unexpected(&found[..1], &pending[..1])
    );
}

#[test]
fn the_scanner_measures_from_fn_to_the_closing_brace() {
    let text = "/// Docs.\n#[inline]\nfn two() {\n}\n\nfn one() {}\n";
    assert_eq!(
        vec![
            Function {
                name: "two".into(),
                line: 3,
                lines: 2
            },
            Function {
                name: "one".into(),
                line: 6,
                lines: 1
            },
        ],
        functions(text)
    );
}

#[test]
fn the_scanner_finds_a_long_function() {
    let body = "    let x = 1;\n".repeat(SRC_LIMIT);
    let text = format!("pub(crate) async fn long() {{\n{body}}}\n");
    let found = functions(&text);
    assert_eq!(1, found.len());
    assert_eq!("long", found[0].name);
    assert_eq!(SRC_LIMIT + 2, found[0].lines);
}

#[test]
fn braces_in_comments_strings_and_chars_are_not_code() {
    let text = r###"fn tricky<'a>(x: &'a str) -> [u8; 4] {
    // a { in a line comment
    /* a { in a block comment /* nested { */ still { */
    let _ = "a { in a string \" with an escaped quote {";
    let _ = r#"a { in a raw string with a " quote {"#;
    let _ = br"{";
    let _ = b"{";
    let _ = c"{";
    let _ = ('{', '\'', b'{', '\u{7b}');
    'outer: loop { break 'outer; }
    [0; 4]
}
fn after() {
}
"###;
    let found = functions(text);
    assert_eq!(
        vec![("tricky", 1, 12), ("after", 13, 2)],
        found
            .iter()
            .map(|function| (function.name.as_str(), function.line, function.lines))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_signature_with_generics_arrays_and_const_blocks_ends_at_its_body() {
    let text = "fn generic<T: Fn(u8) -> [u8; 2], const N: usize>(t: T) -> Array<{ N }>\n\
                where\n    T: Copy,\n{\n    todo!()\n}\n";
    let found = functions(text);
    assert_eq!(1, found.len(), "{found:?}");
    assert_eq!(
        ("generic", 1, 6),
        (found[0].name.as_str(), found[0].line, found[0].lines)
    );
}

#[test]
fn declarations_pointer_types_and_macro_fns_have_no_length() {
    let text = "trait T {\n    fn declared(&self) -> [u8; 2];\n    fn defaulted(&self) {\n    }\n}\n\
                type F = fn(u8) -> u8;\nmacro_rules! m { ($name:ident) => { fn $name() {} }; }\n";
    let names: Vec<String> = functions(text)
        .into_iter()
        .map(|function| function.name)
        .collect();
    assert_eq!(vec!["defaulted".to_string()], names);
}

#[test]
fn nested_functions_count_on_their_own_and_in_their_holder() {
    let text = "fn outer() {\n    fn inner() {\n    }\n}\n";
    let found: Vec<(String, usize)> = functions(text)
        .into_iter()
        .map(|function| (function.name, function.lines))
        .collect();
    assert_eq!(
        vec![("outer".to_string(), 4), ("inner".to_string(), 2)],
        found
    );
}
