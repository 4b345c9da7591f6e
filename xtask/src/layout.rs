//! `cargo xtask layout` (and the first step of `cargo xtask test`): what
//! `docs/ARCHITECTURE.md` says of the code's layout, checked against the code.
//!
//! - **Cycles.** Within each crate, no cycle of top-level modules (a module's files
//!   and submodules count as the module; the crate root, which declares and
//!   re-exports the modules, is no module). A module uses another where its code
//!   names `crate::other` (`$crate::other` in a macro), `super::other` from the top
//!   level, or an item the crate root re-exports from `other` (`crate::Item`); an
//!   item the crate root defines itself is not followed. Comments, strings and
//!   `#[cfg(test)]` items (`mod tests`, test-only functions) are left out; other `cfg`s
//!   count (a feature-gated module is in the graph). A cycle found is an error naming the files and lines of each
//!   step, unless the document's "Cycles" section lists it; a listed cycle that is
//!   gone is an error too, so the section stays current.
//! - **Sizes.** Every Rust source file over [`LIMIT`] lines in the library and binary
//!   sources ([`SOURCES`]: not tests, benches, examples or fuzz targets), and every
//!   Python module of the package ([`PY_SOURCES`]), is listed in the document's "Files
//!   over 500 lines" section, and every file listed there is over the limit.
//! - **Paths.** Every path in backticks in the document (a span with a `/`, or one
//!   ending in `.rs`, `.py`, `.md` or `.toml`; not one with a space, `<`, `*`, `{` or
//!   `://`, nor an extension alone) exists, relative to the repository root.
//!
//! Reads files only; no dependencies.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The document checked, from the repository root.
pub const DOC: &str = "docs/ARCHITECTURE.md";

/// The line count above which a file must be listed, with its reason.
pub const LIMIT: usize = 500;

/// The library and binary sources: each crate's `src/` (the Python extension's own
/// workspace included). Each root (`lib.rs`, `main.rs`, `bin/*.rs`) is a crate.
pub const SOURCES: &[&str] = &[
    "src",
    "runtime/src",
    "macros/src",
    "adapters/torch/src",
    "adapters/xla/src",
    "adapters/cuda/src",
    "python/src",
    "xtask/src",
];

/// The Python package's modules, under the same size rule as the Rust sources.
pub const PY_SOURCES: &[&str] = &["python/handoff"];

const SIZES_SECTION: &str = "Files over 500 lines";
const CYCLES_SECTION: &str = "Cycles";

/// Runs every check, printing what it found; an error lists every problem.
pub fn check(root: &Path) -> Result<(), String> {
    let doc_path = root.join(DOC);
    let doc = std::fs::read_to_string(&doc_path).map_err(|e| format!("{DOC}: cannot read it: {e}"))?;
    let mut problems = Vec::new();
    let files = source_files(root, &mut problems);
    let crates = crates(root, &mut problems);
    check_cycles(&crates, &doc, &mut problems);
    let big = check_sizes(root, &files, &doc, &mut problems);
    let paths = check_paths(root, &doc, &mut problems);
    // Guards against a check that passes because it read nothing.
    let modules: usize = crates.iter().map(|c| c.modules.len()).sum();
    let uses: usize = crates.iter().map(|c| c.edges.values().map(BTreeMap::len).sum::<usize>()).sum();
    for (what, found, least) in [
        ("source files", files.len(), 80),
        ("crates", crates.len(), 8),
        ("modules", modules, 60),
        ("module uses", uses, 100),
        ("paths named in the document", paths, 20),
    ] {
        if found < least {
            problems
                .push(format!("layout: found {found} {what}, expected at least {least}: is the tree read?"));
        }
    }
    if problems.is_empty() {
        println!(
            "xtask: layout: {} crates, {modules} modules, {uses} module uses, no unlisted cycle; \
             {} source files, {big} over {LIMIT} lines, each listed in {DOC}; {paths} named paths exist",
            crates.len(),
            files.len()
        );
        Ok(())
    } else {
        Err(format!("layout check failed:\n  {}", problems.join("\n  ")))
    }
}

// ---------------------------------------------------------------------------------
// Sizes

/// Every `.rs` file under [`SOURCES`] and `.py` file under [`PY_SOURCES`], relative to
/// `root`, sorted.
fn source_files(root: &Path, problems: &mut Vec<String>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for (dirs, ext) in [(SOURCES, "rs"), (PY_SOURCES, "py")] {
        for dir in dirs {
            let before = files.len();
            walk(root, Path::new(dir), ext, &mut files);
            if files.len() == before {
                problems.push(format!("{dir}: no .{ext} sources found"));
            }
        }
    }
    files.sort();
    files
}

fn walk(root: &Path, dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return };
    for entry in entries.flatten() {
        let rel = dir.join(entry.file_name());
        match entry.file_type() {
            Ok(t) if t.is_dir() => walk(root, &rel, ext, out),
            Ok(t) if t.is_file() && rel.extension().is_some_and(|e| e == ext) => out.push(rel),
            _ => {}
        }
    }
}

/// Checks the sizes section against the files; returns how many are over the limit.
fn check_sizes(root: &Path, files: &[PathBuf], doc: &str, problems: &mut Vec<String>) -> usize {
    let Some(section) = section(doc, SIZES_SECTION) else {
        problems.push(format!("{DOC}: no \"## {SIZES_SECTION}\" section"));
        return 0;
    };
    let listed: BTreeSet<&str> =
        backticked(section).filter(|s| s.ends_with(".rs") || s.ends_with(".py")).collect();
    let mut over = 0;
    for file in files {
        let lines = match std::fs::read_to_string(root.join(file)) {
            Ok(text) => text.lines().count(),
            Err(e) => {
                problems.push(format!("{}: cannot read it: {e}", file.display()));
                continue;
            }
        };
        let name = slashed(file);
        let is_listed = listed.contains(name.as_str());
        if lines > LIMIT {
            over += 1;
            if !is_listed {
                problems.push(format!(
                    "{name}: {lines} lines (over {LIMIT}) but not listed in {DOC} \"{SIZES_SECTION}\": \
                     split it by job, or list it with the one job it holds"
                ));
            }
        } else if is_listed {
            problems.push(format!(
                "{name}: listed in {DOC} \"{SIZES_SECTION}\" but has {lines} lines now: take it off the list"
            ));
        }
    }
    let known: BTreeSet<String> = files.iter().map(|f| slashed(f)).collect();
    for name in listed.iter().filter(|n| !known.contains(**n)) {
        problems.push(format!(
            "{DOC} \"{SIZES_SECTION}\" lists `{name}`, which is not a source file counted (see xtask/src/layout.rs)"
        ));
    }
    over
}

// ---------------------------------------------------------------------------------
// Paths

/// Checks that every path named in backticks exists; returns how many were checked.
fn check_paths(root: &Path, doc: &str, problems: &mut Vec<String>) -> usize {
    let mut checked = 0;
    for (i, line) in doc.lines().enumerate() {
        for span in backticked(line).filter(|s| looks_like_path(s)) {
            checked += 1;
            if !root.join(span.trim_end_matches('/')).exists() {
                problems.push(format!(
                    "{DOC}:{}: `{span}` does not exist (paths are from the repository root)",
                    i + 1
                ));
            }
        }
    }
    checked
}

/// Whether a backticked span names a repository path.
fn looks_like_path(span: &str) -> bool {
    let excluded = span.is_empty()
        || span.contains(char::is_whitespace)
        || span.contains(['<', '*', '{'])
        || (span.starts_with('.') && !span.contains('/'));
    let ends = [".rs", ".py", ".md", ".toml"].iter().any(|e| span.ends_with(e));
    !excluded && !span.contains("://") && (span.contains('/') || ends)
}

// ---------------------------------------------------------------------------------
// The document

/// The text of the `## title` section, up to the next `## ` heading.
fn section<'d>(doc: &'d str, title: &str) -> Option<&'d str> {
    let heading = format!("## {title}\n");
    let start = doc.find(&heading)? + heading.len();
    let rest = &doc[start..];
    Some(rest.find("\n## ").map_or(rest, |end| &rest[..end]))
}

/// The spans between backticks (inline code) of `text`.
fn backticked(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}

fn slashed(path: &Path) -> String {
    path.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
}

// ---------------------------------------------------------------------------------
// Cycles

/// A token of Rust code and its line: an identifier, `::`, or any other character
/// but whitespace; comments, strings and character literals are left out.
type Token = (usize, String);

/// A path and the name it brings in (`a::b::C as D`: `([a, b, C], D)`); a module
/// declared with `mod x;`, with the inline modules around the declaration
/// (`mod a { mod x; }`: `([a], x)`).
type Named = (Vec<String>, String);

/// One crate's module graph.
struct Crate {
    /// Its root file, from the repository root (`runtime/src/lib.rs`).
    root: String,
    /// Each top-level module, with its files.
    modules: BTreeMap<String, Vec<String>>,
    /// For each module, the modules it uses, each with the first place it does
    /// (`file:line`).
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

/// A file of a crate's module tree, as read.
struct ModuleFile {
    /// From the repository root.
    path: PathBuf,
    /// The module path from the crate root (empty for the root).
    module: Vec<String>,
    /// Its code, without `#[cfg(test)]` items.
    code: Vec<Token>,
}

/// Every crate under [`SOURCES`] with its module graph.
fn crates(root: &Path, problems: &mut Vec<String>) -> Vec<Crate> {
    let mut roots = Vec::new();
    for dir in SOURCES.iter().map(Path::new) {
        roots.extend(
            ["lib.rs", "main.rs"].map(|n| dir.join(n)).into_iter().filter(|r| root.join(r).is_file()),
        );
        let mut bins = Vec::new();
        walk(root, &dir.join("bin"), "rs", &mut bins);
        bins.sort();
        roots.extend(bins.into_iter().filter(|b| b.parent() == Some(&dir.join("bin"))));
    }
    roots.iter().map(|r| read_crate(root, r, problems)).collect()
}

fn read_crate(root: &Path, crate_root: &Path, problems: &mut Vec<String>) -> Crate {
    let mut files = Vec::new();
    read_module_tree(root, crate_root, Vec::new(), &mut files, problems);
    let mut modules: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in files.iter().filter(|f| !f.module.is_empty()) {
        modules.entry(f.module[0].clone()).or_default().push(slashed(&f.path));
    }
    // What the crate root re-exports, by name: `pub use device::Device;`.
    let mut reexports = BTreeMap::new();
    let root_code = files.iter().find(|f| f.module.is_empty()).map_or(&[][..], |f| &f.code[..]);
    for (i, _) in root_code.iter().enumerate().filter(|(_, (_, t))| t == "use") {
        for (path, name) in use_tree(root_code, i + 1, &[]).0 {
            let first = path.iter().find(|s| *s != "crate" && *s != "self");
            if let Some(m) = first.filter(|m| modules.contains_key(*m)) {
                reexports.insert(name, m.clone());
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for f in files.iter().filter(|f| !f.module.is_empty()) {
        let from = &f.module[0];
        for (line, name) in scan(&f.code, f.module.len()).1 {
            let to = if modules.contains_key(&name) { Some(&name) } else { reexports.get(&name) };
            if let Some(to) = to.filter(|to| *to != from) {
                let at = format!("{}:{line}", slashed(&f.path));
                edges.entry(from.clone()).or_default().entry(to.clone()).or_insert(at);
            }
        }
    }
    Crate { root: slashed(crate_root), modules, edges }
}

/// Reads `file` (module path `module`) and the files of the modules it declares.
fn read_module_tree(
    root: &Path,
    file: &Path,
    module: Vec<String>,
    out: &mut Vec<ModuleFile>,
    problems: &mut Vec<String>,
) {
    let code = match std::fs::read_to_string(root.join(file)) {
        Ok(text) => without_test_items(tokens(&text)),
        Err(e) => return problems.push(format!("{}: cannot read it: {e}", file.display())),
    };
    // `mod x;` of a crate root or a `mod.rs` is `x.rs` beside it; of `a.rs`, `a/x.rs`.
    let parent = file.parent().unwrap_or(Path::new(""));
    let dir = if module.is_empty() || file.ends_with("mod.rs") {
        parent.to_path_buf()
    } else {
        parent.join(file.file_stem().unwrap_or_default())
    };
    let children = scan(&code, module.len()).0;
    out.push(ModuleFile { path: file.to_path_buf(), module: module.clone(), code });
    for (inline, name) in children {
        let dir = inline.iter().fold(dir.clone(), |d, m| d.join(m));
        let candidates = [dir.join(format!("{name}.rs")), dir.join(&name).join("mod.rs")];
        let Some(child) = candidates.iter().find(|c| root.join(c).is_file()) else {
            problems.push(format!("{}: declares `mod {name};` but neither file exists", file.display()));
            continue;
        };
        let path = module.iter().chain(&inline).cloned().chain([name]).collect();
        read_module_tree(root, child, path, out, problems);
    }
}

/// What the code of a file at module depth `depth` declares and names: the modules
/// it declares with `mod x;` (each with the inline modules it is declared in), and
/// each name it reaches at the crate root, with its line: the segment after `crate::`
/// (`$crate::`), or after as many `super::` as lead to the root; each entry of a
/// group (`crate::{a::X, b}`).
fn scan(code: &[Token], depth: usize) -> (Vec<Named>, Vec<Token>) {
    let (mut declared, mut names) = (Vec::new(), Vec::new());
    // The inline modules the scan is in, each with the brace depth it opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut braces = 0usize;
    let at = |i: usize| code.get(i).map_or("", |(_, t)| t.as_str());
    for (i, (line, t)) in code.iter().enumerate() {
        match t.as_str() {
            "{" => braces += 1,
            "}" => {
                braces = braces.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == braces) {
                    inline.pop();
                }
            }
            "mod" if at(i + 2) == ";" => {
                declared.push((inline.iter().map(|m| m.0.clone()).collect(), at(i + 1).into()))
            }
            "mod" if at(i + 2) == "{" => inline.push((at(i + 1).to_string(), braces)),
            "crate" if at(i + 1) == "::" => {
                names.extend(
                    use_tree(code, i, &[])
                        .0
                        .into_iter()
                        .filter_map(|(p, _)| p.get(1).cloned())
                        .map(|n| (*line, n)),
                );
            }
            "super" if at(i.wrapping_sub(1)) != "::" => {
                let mut j = i;
                while at(j) == "super" && at(j + 1) == "::" {
                    j += 2;
                }
                if (j - i) / 2 == depth + inline.len() {
                    names.extend(use_tree(code, j, &[]).0.into_iter().map(|(p, _)| (*line, p[0].clone())));
                }
            }
            _ => {}
        }
    }
    (declared, names)
}

/// Parses the use tree (or path) at `code[i..]` under `prefix`: its leaves, each a
/// path and the name it brings in (`a::{b::C as D, e}` gives `([a, b, C], D)` and
/// `([a, e], e)`), and where it ends.
fn use_tree(code: &[Token], mut i: usize, prefix: &[String]) -> (Vec<Named>, usize) {
    let at = |i: usize| code.get(i).map_or("", |(_, t)| t.as_str());
    let (mut leaves, mut path) = (Vec::new(), prefix.to_vec());
    while is_ident(at(i)) {
        path.push(at(i).to_string());
        if at(i + 1) != "::" {
            i += 1;
            break;
        }
        i += 2;
        if at(i) == "{" {
            i += 1;
            while !matches!(at(i), "}" | "") {
                let (inner, end) = use_tree(code, i, &path);
                leaves.extend(inner);
                i = if at(end) == "," || end == i { end + 1 } else { end };
            }
            return (leaves, i + 1);
        }
    }
    if path.len() > prefix.len() {
        let mut name = path.last().cloned().unwrap_or_default();
        if at(i) == "as" {
            name = at(i + 1).to_string();
            i += 2;
        } else if name == "self" && path.len() > 1 {
            path.pop();
            name = path.last().cloned().unwrap_or_default();
        }
        leaves.push((path, name));
    }
    (leaves, i)
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_alphabetic() || c == '_')
        && t.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The tokens of Rust source `text` (see [`Token`]). A lifetime's quote is dropped,
/// its name kept.
fn tokens(text: &str) -> Vec<Token> {
    let b = text.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    let (mut out, mut line, mut i) = (Vec::new(), 1, 0);
    while i < b.len() {
        let start = i;
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            i += rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    (depth, i) = (depth + 1, i + 2);
                } else if b[i..].starts_with(b"*/") {
                    (depth, i) = (depth - 1, i + 2);
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some((quote, hashes)) = raw_string(b, i) {
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let end = b[quote + 1..].windows(close.len()).position(|w| w == close);
            i = end.map_or(b.len(), |e| quote + 1 + e + close.len());
        } else if rest[0] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if rest[0] == b'\'' {
            // A character literal ('a', '\n', '\'', 'µ'); else a lifetime ('a).
            let len = if rest.get(1) == Some(&b'\\') {
                rest.iter().skip(3).position(|&c| c == b'\'').map(|p| p + 3)
            } else {
                let n = rest.get(1).map_or(1, |&c| c.leading_ones().max(1) as usize);
                (rest.get(1 + n) == Some(&b'\'')).then_some(1 + n)
            };
            i += len.map_or(1, |l| l + 1);
        } else if ident(rest[0]) {
            i += rest.iter().position(|&c| !ident(c)).unwrap_or(rest.len());
            out.push((line, text[start..i].to_string()));
        } else if rest.starts_with(b"::") {
            out.push((line, "::".to_string()));
            i += 2;
        } else {
            if !rest[0].is_ascii_whitespace() {
                out.push((line, text[i..i + 1].to_string()));
            }
            i += 1;
        }
        line += b[start..i.min(b.len())].iter().filter(|&&c| c == b'\n').count();
    }
    out
}

/// Where a raw string starting at `b[i]` (`r"`, `r#"`, `br#"`, not inside an
/// identifier) has its opening quote, and how many `#` it has.
fn raw_string(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let inside = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    let j = match (&b[i..], inside) {
        ([b'r', ..], false) => i + 1,
        ([b'b', b'r', ..], false) => i + 2,
        _ => return None,
    };
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    (b.get(j + hashes) == Some(&b'"')).then_some((j + hashes, hashes))
}

/// `code` without the items under `#[cfg(test)]` (a `mod tests { .. }` or
/// `mod tests;`, a test-only function or import): each to its `;` or closing brace.
fn without_test_items(code: Vec<Token>) -> Vec<Token> {
    let mut out = Vec::with_capacity(code.len());
    let mut i = 0;
    while i < code.len() {
        let cfg_test =
            code[i..].iter().take(7).map(|(_, t)| t.as_str()).eq(["#", "[", "cfg", "(", "test", ")", "]"]);
        if !cfg_test {
            out.push(code[i].clone());
            i += 1;
            continue;
        }
        // Further attributes, then the item.
        let (mut j, mut nesting, mut braces) = (i + 7, 0, 0);
        while j < code.len() {
            match code[j].1.as_str() {
                "(" | "[" => nesting += 1,
                ")" | "]" => nesting -= 1,
                ";" if nesting == 0 && braces == 0 => break,
                "{" if nesting == 0 => braces += 1,
                "}" if nesting == 0 => {
                    braces -= 1;
                    if braces == 0 {
                        break;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        i = j + 1;
    }
    out
}

/// Checks every crate's cycles against those the document lists.
fn check_cycles(crates: &[Crate], doc: &str, problems: &mut Vec<String>) {
    let Some(section) = section(doc, CYCLES_SECTION) else {
        problems.push(format!("{DOC}: no \"## {CYCLES_SECTION}\" section"));
        return;
    };
    let mut listed = listed_cycles(section);
    for c in crates {
        let graph: BTreeMap<String, BTreeSet<String>> = c
            .modules
            .keys()
            .map(|m| (m.clone(), c.edges.get(m).map(|e| e.keys().cloned().collect()).unwrap_or_default()))
            .collect();
        for component in cycles(&graph) {
            let set: BTreeSet<String> = component.iter().cloned().collect();
            if listed.remove(&(c.root.clone(), set)) {
                continue;
            }
            let path = cycle_in(&graph, &component);
            let mut steps = String::new();
            for pair in path.windows(2) {
                let at = &c.edges[&pair[0]][&pair[1]];
                let _ = write!(steps, "\n      {at}: `{}` uses `{}`", pair[0], pair[1]);
            }
            problems.push(format!(
                "{}: module cycle {} (end it, or list it in {DOC} \"{CYCLES_SECTION}\" as \
                 - `{}`: {}):{steps}",
                c.root,
                path.join(" -> "),
                c.root,
                component.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(" <-> "),
            ));
        }
    }
    for (root, set) in listed {
        let names: Vec<String> = set.iter().map(|m| format!("`{m}`")).collect();
        problems.push(format!(
            "{DOC} \"{CYCLES_SECTION}\" lists the cycle {} of `{root}`, which is gone: take it off",
            names.join(" <-> ")
        ));
    }
}

/// The cycles a "Cycles" section lists, one a line: ``- `runtime/src/lib.rs`: `a` <-> `b` ...``.
fn listed_cycles(section: &str) -> BTreeSet<(String, BTreeSet<String>)> {
    let mut out = BTreeSet::new();
    for line in section.lines().filter(|l| l.starts_with("- `") && l.contains(" <-> ")) {
        let mut spans = line.split('`').skip(1);
        let Some(root) = spans.next() else { continue };
        let mut modules = BTreeSet::new();
        // `a` <-> `b` <-> `c`: spans at odd places, joined by " <-> " between them.
        let mut rest = line.split('`').skip(2);
        while let (Some(sep), Some(module)) = (rest.next(), rest.next()) {
            let joined = if modules.is_empty() { sep.trim_start().starts_with(':') } else { sep == " <-> " };
            if !joined {
                break;
            }
            modules.insert(module.to_string());
        }
        if modules.len() > 1 {
            out.insert((root.to_string(), modules));
        }
    }
    out
}

/// The modules of `graph` that lie on a cycle, grouped: each group the nodes that
/// reach one another (a strongly connected component), sorted.
pub fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // What each node reaches through one edge or more.
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&str> = graph.get(from).into_iter().flatten().map(String::as_str).collect();
        while let Some(v) = todo.pop() {
            if seen.insert(v) {
                todo.extend(graph.get(v).into_iter().flatten().map(String::as_str));
            }
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<&str>> = graph.keys().map(|v| (v.as_str(), reach(v))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for v in graph.keys().map(String::as_str).filter(|v| reaches[v].contains(v)) {
        if !out.iter().flatten().any(|w| w == v) {
            let mutual =
                graph.keys().filter(|w| reaches[v].contains(w.as_str()) && reaches[w.as_str()].contains(v));
            out.push(mutual.cloned().collect());
        }
    }
    out
}

/// One cycle through the first node of `component` (one of [`cycles`]'s groups), the
/// shortest, as the path of its nodes, first and last the same.
pub fn cycle_in(graph: &BTreeMap<String, BTreeSet<String>>, component: &[String]) -> Vec<String> {
    let inside: BTreeSet<&str> = component.iter().map(String::as_str).collect();
    let start = component[0].as_str();
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in graph.get(v).into_iter().flatten().map(String::as_str).filter(|w| inside.contains(w)) {
            if w == start {
                let mut path = vec![start.to_string()];
                let mut at = v;
                while at != start {
                    path.push(at.to_string());
                    at = came_from[at];
                }
                path.push(start.to_string());
                path.reverse();
                return path;
            }
            if !came_from.contains_key(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    component.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    }

    #[test]
    fn a_graph_without_a_cycle_has_none() {
        // A diamond and a chain: modules used from two places are no cycle.
        let g = graph(&[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")]);
        assert!(cycles(&g).is_empty());
        assert!(cycles(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn each_cycle_is_found_and_walked_as_a_path() {
        let g = graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("x", "y"), ("y", "x"), ("d", "e")]);
        let found = cycles(&g);
        assert_eq!(found, [vec!["a", "b", "c"], vec!["x", "y"]]);
        assert_eq!(cycle_in(&g, &found[0]), ["a", "b", "c", "a"]);
        assert_eq!(cycle_in(&g, &found[1]), ["x", "y", "x"]);
        // Two cycles through `a` and `c`: one group, walked by its shortest cycle.
        let g = graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("a", "c")]);
        assert_eq!(cycles(&g), [vec!["a", "b", "c"]]);
        assert_eq!(cycle_in(&g, &cycles(&g)[0]), ["a", "c", "a"]);
    }

    fn names(code: &str, depth: usize) -> Vec<String> {
        scan(&without_test_items(tokens(code)), depth).1.into_iter().map(|(_, n)| n).collect()
    }

    #[test]
    fn names_at_the_crate_root_are_read_from_code_only() {
        let code = "use crate::device::Device; // crate::error\n\
                    use crate::{stream::Stream, stats::{self, Counter}};\n\
                    /* crate::mock /* nested */ crate::x */ let s = \"crate::reaper\"; let r = r#\"crate::\"q\"#;\n\
                    let c = '\"'; let e = '\\''; fn f<'a>(_: &'a str) { super::validate::check(); $crate::sys::x(); }\n\
                    pub(crate) fn g() {}\n#[cfg(test)]\nmod tests { use crate::managed; }\n";
        assert_eq!(names(code, 1), ["device", "stream", "stats", "stats", "validate", "sys"]);
        // From a submodule's file, `super::` is its own module.
        assert_eq!(names(code, 2), ["device", "stream", "stats", "stats", "sys"]);
        assert_eq!(tokens(code).iter().find(|(_, t)| t == "validate").map(|(l, _)| *l), Some(4));
    }

    #[test]
    fn declared_modules_and_reexports_are_read() {
        let code = tokens(
            "mod a;\npub mod b { mod c; }\n#[cfg(test)]\nmod tests;\npub use a::{X, y::Z as W, self};\n",
        );
        let code = without_test_items(code);
        assert_eq!(scan(&code, 0).0, [(vec![], "a".to_string()), (vec!["b".to_string()], "c".to_string())]);
        let at = code.iter().position(|(_, t)| t == "use").unwrap();
        let leaves: Vec<String> = use_tree(&code, at + 1, &[]).0.into_iter().map(|(_, n)| n).collect();
        assert_eq!(leaves, ["X", "W", "a"]);
    }

    #[test]
    fn only_paths_are_taken_for_paths() {
        for span in
            ["runtime/src/lib.rs", "adapters/torch/csrc/", "BENCHMARKS.md", "Cargo.toml", "bench/x.py"]
        {
            assert!(looks_like_path(span), "{span}");
        }
        for span in
            ["Storage", "cargo xtask test", "a/<target>/", "https://x/y", "handoff::adapters::*", ".rs"]
        {
            assert!(!looks_like_path(span), "{span}");
        }
    }

    #[test]
    fn listed_cycles_are_read_from_their_lines() {
        let section =
            "Intro `x` <-> `y`.\n\n- `runtime/src/lib.rs`: `device` <-> `error`: why (`z` <-> `w`)\n";
        let set: BTreeSet<String> = ["device", "error"].map(String::from).into();
        assert_eq!(listed_cycles(section), BTreeSet::from([("runtime/src/lib.rs".to_string(), set)]));
    }
}
