//! `cargo xtask layout` (and the first step of `cargo xtask test`): what
//! `docs/ARCHITECTURE.md` says of the code's layout, checked against the code, that
//! the GPU logs are those the documents cite, and that the README stays short.
//!
//! - **Cycles** (`cycles`). Within each crate, no cycle of top-level modules (a
//!   module's files and submodules count as the module; the crate root, which declares
//!   and re-exports the modules, is no module). A module uses another where its code
//!   names `crate::other` (`$crate::other` in a macro), `super::other` from the top
//!   level, or an item the crate root re-exports from `other` (`crate::Item`); an
//!   item the crate root defines itself is not followed. Comments, strings and
//!   `#[cfg(test)]` items (`mod tests`, test-only functions) are left out; other `cfg`s
//!   count (a feature-gated module is in the graph). A cycle found is an error naming
//!   the files and lines of each step, unless the document's "Cycles" section lists
//!   it; a listed cycle that is gone is an error too, so the section stays current.
//! - **Imports** (`imports`), in the same code. A module other than the crate root
//!   names an item the root re-exports from one of its modules by that module's path
//!   (`crate::stream::Stream`), not through the root (`crate::Stream`, `$crate::Stream`,
//!   `super::Stream` from the top level); modules and the root's own items are named
//!   from the root. No `pub use` (any `pub(..)`) renames one of the crate's own items
//!   (`pub use home::here as home_here`). Each is an error naming the file and line.
//! - **Sizes.** Every Rust source file over [`LIMIT`] lines in the library and binary
//!   sources ([`SOURCES`]: not tests, benches, examples or fuzz targets), and every
//!   Python module of the package ([`PY_SOURCES`]), is listed in the document's "Files
//!   over 500 lines" section, and every file listed there is over the limit.
//! - **Paths.** Every path in backticks in the document (a span with a `/`, or one
//!   ending in `.rs`, `.py`, `.md` or `.toml`; not one with a space, `<`, `*`, `{` or
//!   `://`, nor an extension alone) exists, relative to the repository root.
//! - **The walk** (`walk`). Every function the document's walk of one tensor names (its
//!   numbered hops, their side calls, the releases after them) is a `fn` of the file
//!   the text gives it; the hops and files it states are those counted; and how many
//!   hops come back to each file is printed.
//! - **The GPU logs** (`citations`). Every file under `docs/gpu-runs/` is cited (its path,
//!   a folder above it or a `*` pattern matching it, in a Markdown file, a Rust file of
//!   `xtask/src/`, or a log `bench/readme_performance.py` reads from its run), every
//!   path cited there exists, and there are at most 100 files. Each is an error naming
//!   the file (and the citing file and line).
//! - **The README** (`readme`). `README.md`'s first Rust and Python examples end within
//!   its first 60 lines, its words are within budget, and `examples/src.rs` compiles its
//!   Rust blocks as doctests. Each is an error naming the line or the count.
//!
//! Each check also counts what it read, and fails below a floor: a check that read
//! nothing would otherwise pass. Reads files only; no dependencies.

mod citations;
mod cycles;
mod imports;
mod readme;
mod tokens;
mod walk;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use tokens::{Token, tokens, use_tree, without_test_items};

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
    cycles::check_cycles(&crates, &doc, &mut problems);
    let (mut root_paths, mut reexports) = (0, 0);
    for c in &crates {
        let (p, r) = imports::check(c, &mut problems);
        (root_paths, reexports) = (root_paths + p, reexports + r);
    }
    let big = check_sizes(root, &files, &doc, &mut problems);
    let paths = check_paths(root, &doc, &mut problems);
    let walk = walk::check(root, &files, &doc, &mut problems);
    let logs = citations::check(root, &mut problems);
    let readme = readme::check(root, &mut problems);
    // Guards against a check that passes because it read nothing.
    let modules: usize = crates.iter().map(|c| c.modules.len()).sum();
    let uses: usize = crates.iter().map(|c| c.edges.values().map(BTreeMap::len).sum::<usize>()).sum();
    for (what, found, least) in [
        ("source files", files.len(), 80),
        ("crates", crates.len(), 8),
        ("modules", modules, 60),
        ("module uses", uses, 100),
        ("paths from a crate root", root_paths, 300),
        ("re-exports", reexports, 50),
        ("paths named in the document", paths, 20),
        ("names in the walk", walk.names, 80),
        ("hops in the walk", walk.hops, 30),
        ("Markdown files read for citations of the GPU logs", logs.markdown, 5),
        ("citations of the GPU logs", logs.cited, 20),
        ("GPU logs", logs.logs, 20),
        ("words in the README", readme.words, 500),
    ] {
        if found < least {
            problems
                .push(format!("layout: found {found} {what}, expected at least {least}: is the tree read?"));
        }
    }
    if problems.is_empty() {
        println!(
            "xtask: layout: {} crates, {modules} modules, {uses} module uses, no unlisted cycle; \
             {root_paths} paths from a crate root, none through a re-export; {reexports} re-exports, \
             none renaming its crate's item; {} source files, {big} over {LIMIT} lines, each listed in {DOC}; \
             {paths} named paths exist; the walk's {} names exist ({} in the file given them)",
            crates.len(),
            files.len(),
            walk.names,
            walk.with_file,
        );
        let mut returns: Vec<(&String, &usize)> = walk.returns.iter().collect();
        returns.sort_by_key(|(f, n)| (std::cmp::Reverse(**n), *f));
        let returns: Vec<String> = returns.iter().map(|(f, n)| format!("{f} {n}")).collect();
        println!(
            "xtask: layout: the walk: {} hops through {} files; hops back to a file it had left: {}",
            walk.hops,
            walk.files,
            if returns.is_empty() { "none".into() } else { returns.join(", ") }
        );
        println!(
            "xtask: layout: {} GPU logs in {}/ (at most {}), each cited; {} citations of them \
             ({} Markdown files, xtask's sources, {}), each present",
            logs.logs,
            citations::RUNS,
            citations::MAX_LOGS,
            logs.cited,
            logs.markdown,
            citations::SCRIPTS.join(", ")
        );
        println!("xtask: layout: {}", readme.summary());
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
// The crates' module trees

/// A module declared with `mod x;`, with the inline modules around the declaration
/// (`mod a { mod x; }`: `([a], x)`).
type Declared = (Vec<String>, String);

/// One crate's module graph.
struct Crate {
    /// Its root file, from the repository root (`runtime/src/lib.rs`).
    root: String,
    /// Each top-level module, with its files.
    modules: BTreeMap<String, Vec<String>>,
    /// What the crate root brings in from its modules, by name, each with its path
    /// from the root (`pub use reaper::{drain, Drained};`: `drain` is `[reaper, drain]`).
    reexports: BTreeMap<String, Vec<String>>,
    /// For each module, the modules it uses, each with the first place it does
    /// (`file:line`).
    edges: BTreeMap<String, BTreeMap<String, String>>,
    /// Its files, the root first.
    files: Vec<ModuleFile>,
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
    let root_code = files.iter().find(|f| f.module.is_empty()).map_or(&[][..], |f| &f.code[..]);
    let reexports = reexports(root_code, |m| modules.contains_key(m));
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for f in files.iter().filter(|f| !f.module.is_empty()) {
        let from = &f.module[0];
        for (line, path) in scan(&f.code, f.module.len()).1 {
            let name = &path[0];
            let to = if modules.contains_key(name) { Some(name) } else { reexports.get(name).map(|p| &p[0]) };
            if let Some(to) = to.filter(|to| *to != from) {
                let at = format!("{}:{line}", slashed(&f.path));
                edges.entry(from.clone()).or_default().entry(to.clone()).or_insert(at);
            }
        }
    }
    Crate { root: slashed(crate_root), modules, reexports, edges, files }
}

/// What the crate root (its code `root_code`) brings in from its modules (those for
/// which `is_module` holds), by name, each with its path from the root: `pub use
/// device::Device;` (or a private `use`) gives `Device`, `[device, Device]`.
fn reexports(root_code: &[Token], is_module: impl Fn(&str) -> bool) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for (i, _) in root_code.iter().enumerate().filter(|(_, (_, t))| t == "use") {
        for leaf in use_tree(root_code, i + 1, &[]).0 {
            let path: Vec<String> =
                leaf.path.into_iter().skip_while(|s| s == "crate" || s == "self").collect();
            if path.first().is_some_and(|m| is_module(m)) {
                out.insert(leaf.name, path);
            }
        }
    }
    out
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
/// each path it names from the crate root, with its line: the segments after `crate::`
/// (`$crate::`), or after as many `super::` as lead to the root; each entry of a
/// group (`crate::{a::X, b}`: `[a, X]` and `[b]`).
fn scan(code: &[Token], depth: usize) -> (Vec<Declared>, Vec<(usize, Vec<String>)>) {
    let (mut declared, mut names) = (Vec::new(), Vec::new());
    // The inline modules the scan is in, each with the brace depth it opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut braces = 0usize;
    let at = |i: usize| code.get(i).map_or("", |(_, t)| t.as_str());
    for (i, (_, t)) in code.iter().enumerate() {
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
                let leaves = use_tree(code, i, &[]).0.into_iter().filter(|l| l.path.len() > 1);
                names.extend(leaves.map(|l| (l.line, l.path[1..].to_vec())));
            }
            "super" if at(i.wrapping_sub(1)) != "::" => {
                let mut j = i;
                while at(j) == "super" && at(j + 1) == "::" {
                    j += 2;
                }
                if (j - i) / 2 == depth + inline.len() {
                    names.extend(use_tree(code, j, &[]).0.into_iter().map(|l| (l.line, l.path)));
                }
            }
            _ => {}
        }
    }
    (declared, names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(code: &str, depth: usize) -> Vec<String> {
        scan(&without_test_items(tokens(code)), depth).1.into_iter().map(|(_, p)| p[0].clone()).collect()
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
        let leaves: Vec<(String, bool)> =
            use_tree(&code, at + 1, &[]).0.into_iter().map(|l| (l.name, l.renamed)).collect();
        assert_eq!(leaves, [("X".into(), false), ("W".into(), true), ("a".into(), false)]);
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
}
