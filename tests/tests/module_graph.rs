//! No module cycle anywhere in the workspace: among the modules of one
//! parent (a crate's top-level modules, or a folder's files), what uses what
//! must be a tree of layers, so a change flows one way and a module can be
//! understood, and split off into a crate of its own, without its users.
//!
//! A module's dependencies are the paths it names through `crate::`,
//! `super::` and `self::` (in `use` and inline), outside comments and its
//! tests. A reference from `a/x.rs` to `b::y` counts as `a -> b` among the
//! crate's top-level modules; from `a/x.rs` to `a::z` as `x -> z` among
//! `a`'s. A module's use of its parent's own items is no edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: &[&str] = &[
    "store/src",
    "collectors/src",
    "detect/src",
    "agent/src",
    "exporters/src",
    "tests/src",
];

type ModulePath = Vec<String>;

/// Every source file of a crate, by its module path.
fn modules(src: &Path) -> BTreeMap<ModulePath, PathBuf> {
    let mut found = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(src).unwrap();
            if path.is_dir() {
                // `src/bin/*` are crates of their own.
                if rel != Path::new("bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let mut module: ModulePath = rel
                .iter()
                .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            let last = module.last().cloned().unwrap_or_default();
            if matches!(last.as_str(), "mod" | "lib" | "main") {
                module.pop();
            }
            found.insert(module, path);
        }
    }
    found
}

/// Whether a file holds only tests (`tests.rs`, `*_tests.rs`, `testutil.rs`).
fn is_test_file(module: &[String]) -> bool {
    module
        .last()
        .is_some_and(|last| last == "tests" || last.ends_with("_tests") || last == "testutil")
}

/// The source without comments, string contents and `#[cfg(test)]` modules.
fn code_of(source: &str) -> String {
    without_test_modules(&without_literals(source))
}

/// `code` (already without comments and literals) without the modules
/// marked `#[cfg(test)]`, braces counted.
fn without_test_modules(code: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let after = &rest[at + MARK.len()..];
        let item = after.trim_start();
        if !(item.starts_with("mod ")
            || item.starts_with("pub mod ")
            || item.starts_with("pub(crate) mod "))
        {
            out.push_str(MARK);
            rest = after;
            continue;
        }
        let Some(open) = after.find(['{', ';']) else {
            return out;
        };
        if after.as_bytes()[open] == b';' {
            rest = &after[open + 1..];
            continue;
        }
        let mut depth = 0;
        let mut end = after.len();
        for (k, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The source without comments and with string and character literals
/// emptied, so that what remains is code.
fn without_literals(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &source[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |end| end + 2);
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|c| *c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            i += rest[body..]
                .find(&close)
                .map_or(rest.len(), |end| body + end + close.len());
            out.push_str("\"\"");
        } else if let Some(len) = char_literal_len(rest) {
            // `'"'` or `'{'` is no string and no brace; `'a` is a lifetime.
            i += len;
            out.push_str("' '");
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() {
                match rest.as_bytes()[j] {
                    b'\\' => j += 2,
                    b'"' => break,
                    _ => j += 1,
                }
            }
            i += (j + 1).min(rest.len());
            out.push_str("\"\"");
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of the character literal `text` starts with (`'x'`, `'\''`,
/// `'\u{7f}'`), or None: not a quote, or a lifetime.
fn char_literal_len(text: &str) -> Option<usize> {
    let rest = text.strip_prefix('\'')?;
    if let Some(escaped) = rest.strip_prefix('\\') {
        let close = escaped.char_indices().skip(1).find(|(_, c)| *c == '\'')?.0;
        return Some(2 + close + 1);
    }
    let c = rest.chars().next()?;
    rest[c.len_utf8()..]
        .starts_with('\'')
        .then(|| 1 + c.len_utf8() + 1)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Reads `ident(::ident)*` and, after a `::{`, each path of the group, from
/// `text`; returns the paths and how far it read.
fn paths_at(text: &str, prefix: &[String]) -> (Vec<ModulePath>, usize) {
    let mut segments = prefix.to_vec();
    let mut i = 0;
    let bytes = text.as_bytes();
    loop {
        let start = i;
        while i < bytes.len() && is_ident(bytes[i] as char) {
            i += 1;
        }
        if i > start {
            segments.push(text[start..i].to_string());
        }
        if text[i..].starts_with("::") {
            i += 2;
            let skipped = text[i..].len() - text[i..].trim_start().len();
            i += skipped;
            if text[i..].starts_with('{') {
                i += 1;
                let mut all = Vec::new();
                loop {
                    let skipped = text[i..].len() - text[i..].trim_start().len();
                    i += skipped;
                    if i >= text.len() || text[i..].starts_with('}') {
                        i += 1;
                        return (all, i);
                    }
                    let (inner, used) = paths_at(&text[i..], &segments);
                    all.extend(inner);
                    i += used.max(1);
                    let skipped = text[i..].len() - text[i..].trim_start().len();
                    i += skipped;
                    if text[i..].starts_with(',') {
                        i += 1;
                    }
                }
            }
            continue;
        }
        return (vec![segments], i);
    }
}

/// The module paths `code` (of the file of `module`) refers to, resolved
/// from the crate root.
fn references(code: &str, module: &ModulePath) -> Vec<ModulePath> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let before = code[..i].chars().next_back();
        let starts_word = !before.is_some_and(|c| is_ident(c) || c == ':');
        let keyword = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|k| rest.starts_with(k));
        let Some(keyword) = keyword.filter(|_| starts_word || before == Some('$')) else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let (paths, used) = paths_at(rest, &[]);
        i += used.max(keyword.len());
        for path in paths {
            // The module the path starts from, then its segments.
            let mut base: ModulePath = Vec::new();
            let mut segments = path.into_iter().peekable();
            match segments.peek().map(String::as_str) {
                Some("crate") => {
                    segments.next();
                }
                Some("self") => {
                    segments.next();
                    base = module.clone();
                }
                Some("super") => {
                    // `super` in `a/b.rs` (module `a::b`) is `a`, and in
                    // `a/mod.rs` (module `a`) the crate root: one up each.
                    base = module.clone();
                    while segments.peek().map(String::as_str) == Some("super") {
                        segments.next();
                        base.pop();
                    }
                }
                _ => continue,
            }
            base.extend(segments);
            found.push(base);
        }
    }
    found
}

/// Cycles among each parent's child modules: (parent, the cycle).
fn cycles(src: &Path) -> Vec<(ModulePath, Vec<String>, Vec<String>)> {
    let modules = modules(src);
    let known: BTreeSet<&ModulePath> = modules.keys().collect();
    // parent -> child -> (child it uses, an example file)
    let mut edges: BTreeMap<ModulePath, BTreeMap<String, BTreeMap<String, String>>> =
        BTreeMap::new();
    for (module, path) in &modules {
        if is_test_file(module) {
            continue;
        }
        let source = std::fs::read_to_string(path).unwrap();
        let code = code_of(&source);
        for target in references(&code, module) {
            // The longest prefix that is a module: the rest are items.
            let mut target = target;
            while !target.is_empty() && !known.contains(&target) {
                target.pop();
            }
            let shared = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if shared < module.len() && shared < target.len() {
                edges
                    .entry(module[..shared].to_vec())
                    .or_default()
                    .entry(module[shared].clone())
                    .or_default()
                    .entry(target[shared].clone())
                    .or_insert_with(|| path.strip_prefix(src).unwrap().display().to_string());
            }
        }
    }
    let mut found = Vec::new();
    for (parent, graph) in &edges {
        // Depth-first search for a back edge; each cycle reported once.
        let mut state: BTreeMap<&str, u8> = BTreeMap::new();
        fn visit<'a>(
            node: &'a str,
            graph: &'a BTreeMap<String, BTreeMap<String, String>>,
            state: &mut BTreeMap<&'a str, u8>,
            stack: &mut Vec<&'a str>,
            out: &mut Vec<(Vec<String>, Vec<String>)>,
        ) {
            state.insert(node, 1);
            stack.push(node);
            for next in graph.get(node).into_iter().flat_map(|g| g.keys()) {
                match state.get(next.as_str()) {
                    Some(1) => {
                        let from = stack.iter().position(|n| *n == next).unwrap();
                        let cycle: Vec<String> =
                            stack[from..].iter().map(|s| s.to_string()).collect();
                        let mut files = Vec::new();
                        for (k, a) in cycle.iter().enumerate() {
                            let b = &cycle[(k + 1) % cycle.len()];
                            files.push(format!("{a} -> {b} ({})", graph[a][b]));
                        }
                        out.push((cycle, files));
                    }
                    Some(_) => {}
                    None => visit(next, graph, state, stack, out),
                }
            }
            stack.pop();
            state.insert(node, 2);
        }
        let mut out = Vec::new();
        for node in graph.keys() {
            if !state.contains_key(node.as_str()) {
                visit(node, graph, &mut state, &mut Vec::new(), &mut out);
            }
        }
        for (cycle, files) in out {
            found.push((parent.clone(), cycle, files));
        }
    }
    found
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn no_module_cycle_in_the_workspace() {
    let mut report = Vec::new();
    for krate in CRATES {
        for (parent, cycle, files) in cycles(&workspace().join(krate)) {
            report.push(format!(
                "{krate}/{}: {} ({})",
                parent.join("/"),
                cycle.join(" -> "),
                files.join("; ")
            ));
        }
    }
    assert!(report.is_empty(), "module cycles:\n{}", report.join("\n"));
}

/// The check sees a cycle: two sibling modules that use each other, one
/// through a grouped `use super::{...}`, one through an inline `crate::` path.
#[test]
fn a_cycle_between_siblings_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("store")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod store;\npub mod scan;\n").unwrap();
    std::fs::write(
        src.join("store/mod.rs"),
        "mod merge;\nmod files;\n// crate::scan::nothing, in a comment\n",
    )
    .unwrap();
    std::fs::write(
        src.join("store/merge.rs"),
        "use super::{files::List, Thing};\nfn f() { let s = \"super::x\"; }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("store/files.rs"),
        "fn g() { crate::store::merge::run(); }\n#[cfg(test)]\nmod tests { use crate::scan::Scan; }\n",
    )
    .unwrap();
    std::fs::write(src.join("scan.rs"), "use crate::store::Store;\n").unwrap();
    let found = cycles(src);
    assert_eq!(found.len(), 1, "{found:?}");
    let (parent, cycle, _) = &found[0];
    assert_eq!(parent, &vec!["store".to_string()]);
    let mut cycle = cycle.clone();
    cycle.sort();
    assert_eq!(cycle, ["files", "merge"]);
    // The top level holds no cycle: scan uses store, and store's use of scan
    // is in a comment and in a test module only.
}
