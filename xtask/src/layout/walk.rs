//! The document's walk of one tensor ("One tensor, from `tch::Tensor` ..."): each
//! function it names exists in the file the text gives it, and the hops, counted, come
//! back to a file as often as printed; the hops and files the text counts in bold
//! (`**36 hops**`, `**16 files**`) are those of its numbered lines.
//!
//! Read from the walk: each numbered line (`N. ` or `N. to M. `, one hop a number),
//! its hop (the names before its first `:`, those before `->` the callers, those
//! after it the callees; a name after `for` is a type and left out) and its side calls
//! (in `[..]`, each clause up to `;`, its names before a `:`); in the bullets after
//! it, names with a path (`a::b`) or a file. A name's file is the one in parentheses
//! after it (`` `f` (`a/b.rs`) ``) or after `of` (`` `f` of `a/b.rs` ``), else the
//! one it was last given; that file must have it. Else, among the files that have
//! it: for a hop, the file of the hop name before it; else the one file; else the one
//! that defines its type. A file has a name when it has `fn` of its last segment, names
//! each type in its path (`Type::f`) and has each module of its path (`module::f`) in
//! its own path. A hop goes from the file of its first caller to that of its first
//! callee (`N. to M.`: of each in turn).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::tokens::{is_ident, tokens, without_test_items};
use super::{DOC, looks_like_path, section, slashed};

/// The walk's section.
pub(super) const WALK_SECTION: &str = "One tensor, from `tch::Tensor` through an XLA kernel and back";

/// What the walk check read.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Walk {
    /// The names checked, and how many of them the text gave a file (there or before).
    pub names: usize,
    pub with_file: usize,
    /// The hops (numbered lines), and the files their callers and callees are in.
    pub hops: usize,
    pub files: usize,
    /// For each file, how many hops come back to it from another file after the walk
    /// has been there.
    pub returns: BTreeMap<String, usize>,
}

/// A source file as the check needs it: the functions and types it defines and
/// every identifier it names.
#[derive(Default)]
struct Source {
    fns: BTreeSet<String>,
    types: BTreeSet<String>,
    idents: BTreeSet<String>,
}

impl Source {
    fn read(text: &str) -> Source {
        let code = without_test_items(tokens(text));
        let mut source = Source::default();
        for pair in code.windows(2) {
            match pair[0].1.as_str() {
                "fn" => source.fns.insert(pair[1].1.clone()),
                "struct" | "enum" | "union" | "trait" | "type" => source.types.insert(pair[1].1.clone()),
                _ => false,
            };
        }
        source.idents = code.into_iter().map(|(_, t)| t).filter(|t| is_ident(t)).collect();
        source
    }
}

/// Reads the Rust files among `files` and checks the walk against them.
pub(super) fn check(root: &Path, files: &[PathBuf], doc: &str, problems: &mut Vec<String>) -> Walk {
    let sources: BTreeMap<String, Source> = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        .filter_map(|f| Some((slashed(f), Source::read(&std::fs::read_to_string(root.join(f)).ok()?))))
        .collect();
    let Some(at) = doc.find(&format!("## {WALK_SECTION}\n")) else {
        problems.push(format!("{DOC}: no \"## {WALK_SECTION}\" section"));
        return Walk::default();
    };
    let first_line = doc[..at].lines().count() + 1;
    let text = section(doc, WALK_SECTION).unwrap_or_default();
    let walk = check_walk(text, first_line, &sources, problems);
    check_stated(text, &walk, problems);
    walk
}

/// Checks the counts the text states in bold (`**36 hops** through **16 files**`)
/// against those of the walk read.
fn check_stated(text: &str, walk: &Walk, problems: &mut Vec<String>) {
    for (unit, counted) in [("hops", walk.hops), ("files", walk.files)] {
        for span in text.split("**").skip(1).step_by(2) {
            let stated = span.strip_suffix(unit).and_then(|n| n.trim().parse::<usize>().ok());
            if let Some(stated) = stated.filter(|s| *s != counted) {
                problems.push(format!(
                    "{DOC} \"{WALK_SECTION}\": states **{stated} {unit}**, but its numbered lines count {counted}"
                ));
            }
        }
    }
}

/// A name as the text gives it: where, and the file in parentheses after it, if any.
#[derive(Clone, Debug, PartialEq)]
struct Name {
    name: String,
    file: Option<String>,
    line: usize,
}

/// What a stretch of text names, in order; `Arrow` for each `->` between names.
#[derive(Debug, PartialEq)]
enum Piece {
    Name(Name),
    Arrow,
}

/// The names and arrows of `text` (starting at document line `line`).
fn pieces(text: &str, first_line: usize) -> Vec<Piece> {
    let parts: Vec<&str> = text.split('`').collect();
    let mut out = Vec::new();
    for (k, span) in parts.iter().enumerate().skip(1).step_by(2) {
        let line = first_line + parts[..k].iter().map(|p| p.matches('\n').count()).sum::<usize>();
        let before = parts[k - 1].trim();
        if before.contains("->") {
            out.push(Piece::Arrow);
        }
        if looks_like_path(span) {
            // `f` (`file`) or `f` of `file`: the file of the name just before.
            if (before == "(" || before == "of")
                && let Some(Piece::Name(n)) = out.last_mut()
            {
                n.file = Some(span.trim_end_matches('/').to_string());
            }
        } else if !(before.ends_with(" for") || before == "for") && is_name(span) {
            out.push(Piece::Name(Name { name: span.to_string(), file: None, line }));
        }
    }
    out
}

/// Whether a span names a function (or a type): identifiers joined by `::`.
fn is_name(span: &str) -> bool {
    !span.is_empty() && span.split("::").all(is_ident)
}

/// `text` split at `sep` where it stands outside backticks.
fn split_outside<'t>(text: &'t str, sep: &[char]) -> Vec<&'t str> {
    let (mut out, mut start, mut inside) = (Vec::new(), 0, false);
    for (i, c) in text.char_indices() {
        if c == '`' {
            inside = !inside;
        } else if !inside && sep.contains(&c) {
            out.push(&text[start..i]);
            start = i + c.len_utf8();
        }
    }
    out.push(&text[start..]);
    out
}

/// The text up to its first `:` outside backticks.
fn before_colon(text: &str) -> &str {
    split_outside(text, &[':'])[0]
}

/// One numbered line of the walk: how many hops it counts, its hop's callers and
/// callees, and its side calls (with a name given its file by `of` after the hop).
#[derive(Debug, PartialEq)]
struct Step {
    hops: usize,
    callers: Vec<Name>,
    callees: Vec<Name>,
    sides: Vec<Name>,
}

/// Reads a numbered line (`12. ...`, `29. to 30. ...`); `None` for any other line.
fn step(text: &str, line: usize) -> Option<Step> {
    let number = |t: &str| -> Option<(usize, usize)> {
        let digits = t.find(|c: char| !c.is_ascii_digit())?;
        let rest = t[digits..].strip_prefix(". ")?;
        Some((t[..digits].parse().ok()?, t.len() - rest.len()))
    };
    let (from, len) = number(text)?;
    let mut rest = &text[len..];
    let mut hops = 1;
    if let Some((to, len)) = rest.strip_prefix("to ").and_then(number) {
        hops = to.checked_sub(from)? + 1;
        rest = &rest[3 + len..];
    }
    // The side calls, in brackets outside backticks.
    let (mut main, mut sides, mut depth, mut inside) = (String::new(), Vec::new(), 0, false);
    for c in rest.chars() {
        match c {
            '`' => inside = !inside,
            '[' if !inside => {
                depth += 1;
                if depth == 1 {
                    sides.push(String::new());
                    continue;
                }
            }
            ']' if !inside => {
                depth -= 1;
                if depth == 0 {
                    continue;
                }
            }
            _ => {}
        }
        match (depth, sides.last_mut()) {
            (0, _) | (_, None) => main.push(c),
            (_, Some(side)) => side.push(c),
        }
    }
    let (mut callers, mut callees, mut arrow) = (Vec::new(), Vec::new(), false);
    for piece in pieces(before_colon(&main), line) {
        match piece {
            Piece::Arrow => arrow = true,
            Piece::Name(n) if arrow => callees.push(n),
            Piece::Name(n) => callers.push(n),
        }
    }
    let clauses = sides.iter().flat_map(|s| split_outside(s, &[';'])).map(before_colon);
    let mut sides: Vec<Name> = clauses.flat_map(|c| pieces(c, line)).filter_map(named).collect();
    // After the hop, only a name given its file with `of` (`` `f` of `a/b.rs` ``).
    let hop = before_colon(&main).len();
    let after = pieces(main.get(hop..).unwrap_or_default(), line).into_iter().filter_map(named);
    sides.extend(after.filter(|n| n.file.is_some() && main[hop..].contains(&format!("`{}` of `", n.name))));
    Some(Step { hops, callers, callees, sides })
}

fn named(piece: Piece) -> Option<Name> {
    match piece {
        Piece::Name(n) => Some(n),
        Piece::Arrow => None,
    }
}

/// Checks the walk (`text`, the section, starting at document line `first_line`)
/// against `sources`.
fn check_walk(
    text: &str,
    first_line: usize,
    sources: &BTreeMap<String, Source>,
    problems: &mut Vec<String>,
) -> Walk {
    let mut walk = Walk::default();
    let mut given: BTreeMap<String, String> = BTreeMap::new();
    let mut last_hop_file: Option<String> = None;
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut bullet: Option<(usize, String)> = None;
    let mut lines = text.lines().enumerate().map(|(i, l)| (first_line + 1 + i, l)).peekable();
    while let Some((line, text)) = lines.next() {
        if let Some(step) = step(text, line) {
            let mut files = |names: &[Name], hop: bool, walk: &mut Walk| -> Vec<Option<String>> {
                let mut out = Vec::new();
                for n in names {
                    let before = hop.then(|| last_hop_file.clone());
                    let file = resolve(n, &mut given, before, sources, walk, problems);
                    if hop && file.is_some() {
                        last_hop_file.clone_from(&file);
                    }
                    out.push(file);
                }
                out
            };
            let callers = files(&step.callers, true, &mut walk);
            let callees = files(&step.callees, true, &mut walk);
            files(&step.sides, false, &mut walk);
            if callers.is_empty() || callees.is_empty() {
                problems.push(format!(
                    "{DOC}:{line}: a hop reads `caller` -> `callee`; found no {}",
                    if callers.is_empty() { "caller" } else { "callee" }
                ));
                continue;
            }
            for j in 0..step.hops {
                let from = callers[j.min(callers.len() - 1)].clone();
                let to = callees[j.min(callees.len() - 1)].clone();
                walk.hops += 1;
                let (Some(from), Some(to)) = (from, to) else { continue };
                seen.insert(from.clone());
                if to != from && seen.contains(&to) {
                    *walk.returns.entry(to.clone()).or_default() += 1;
                }
                seen.insert(to);
            }
            continue;
        }
        // The bullets after the walk, each with its continuation lines.
        if let Some(start) = text.strip_prefix("- ") {
            bullet = Some((line, start.to_string()));
        } else if let Some((_, b)) = bullet.as_mut().filter(|_| text.starts_with("  ")) {
            b.push('\n');
            b.push_str(text.trim());
        }
        let ends = lines.peek().is_none_or(|(_, next)| !next.starts_with("  "));
        if let Some((at, b)) = bullet.take_if(|_| ends) {
            for n in pieces(&b, at).into_iter().filter_map(named) {
                if n.name.contains("::") || n.file.is_some() {
                    resolve(&n, &mut given, None, sources, &mut walk, problems);
                }
            }
        }
    }
    walk.files = seen.len();
    walk
}

/// The file of `n`, checked: the file the text gives it (here, else where it last
/// gave one), else, among the files that have it: for a hop (`hop`, holding the file
/// of the hop name before it), that file; else the one file; else the one that
/// defines its type. A file given that does not have it is a problem; so is a name
/// no file has, and a hop's name several files have (its file is needed to count).
fn resolve(
    n: &Name,
    given: &mut BTreeMap<String, String>,
    hop: Option<Option<String>>,
    sources: &BTreeMap<String, Source>,
    walk: &mut Walk,
    problems: &mut Vec<String>,
) -> Option<String> {
    walk.names += 1;
    let line = n.line;
    if let Some(file) = n.file.as_ref().or(given.get(&n.name)).cloned() {
        walk.with_file += 1;
        given.insert(n.name.clone(), file.clone());
        match sources.get(&file) {
            Some(source) if has(source, &file, &n.name) => {}
            Some(_) => problems.push(format!(
                "{DOC}:{line}: `{}` is given to `{file}`, which does not have it ({})",
                n.name,
                wanted(&n.name)
            )),
            None => problems.push(format!(
                "{DOC}:{line}: `{}` is given to `{file}`, which is not a source file read",
                n.name
            )),
        }
        return Some(file);
    }
    let found: Vec<&String> = sources.iter().filter(|(f, s)| has(s, f, &n.name)).map(|(f, _)| f).collect();
    let defines = |f: &&String| {
        let ty = n.name.split("::").find(|s| s.starts_with(char::is_uppercase));
        ty.is_some_and(|ty| sources[f.as_str()].types.contains(ty))
    };
    let before = hop.as_ref().and_then(|h| h.as_ref()).filter(|f| found.contains(f)).cloned();
    let file = match (before, &found[..]) {
        (Some(inferred), _) => Some(inferred),
        (None, []) => {
            problems.push(format!("{DOC}:{line}: `{}`: no source file has it ({})", n.name, wanted(&n.name)));
            None
        }
        (None, [one]) => Some(one.to_string()),
        (None, _) => match found.iter().copied().filter(defines).collect::<Vec<_>>()[..] {
            [one] => Some(one.to_string()),
            _ => {
                if hop.is_some() {
                    problems.push(format!(
                        "{DOC}:{line}: `{}`: several files have it; give the hop its file",
                        n.name
                    ));
                }
                None
            }
        },
    };
    if let Some(file) = &file {
        given.insert(n.name.clone(), file.clone());
    }
    file
}

/// Whether `source` (the file `file`) has the function `name` (`Type::f`,
/// `module::f`, `f`).
fn has(source: &Source, file: &str, name: &str) -> bool {
    let segments: Vec<&str> = name.split("::").collect();
    let (f, path) = segments.split_last().unwrap_or((&"", &[]));
    let components: Vec<&str> = file.trim_end_matches(".rs").split('/').collect();
    source.fns.contains(*f)
        && path.iter().all(|s| {
            if s.starts_with(char::is_uppercase) {
                source.idents.contains(*s)
            } else {
                components.contains(s)
            }
        })
}

/// What [`has`] looks for, in words.
fn wanted(name: &str) -> String {
    let segments: Vec<&str> = name.split("::").collect();
    let (f, path) = segments.split_last().unwrap_or((&"", &[]));
    let mut out = format!("`fn {f}`");
    for s in path {
        if s.starts_with(char::is_uppercase) {
            out += &format!(", `{s}` named");
        } else {
            out += &format!(", `{s}` in its path");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(name: &str, file: Option<&str>) -> Name {
        Name { name: name.into(), file: file.map(String::from), line: 1 }
    }

    #[test]
    fn a_numbered_line_is_read_as_a_hop_and_side_calls() {
        let line = "6. `Inputs::push` (`a/src/inputs.rs`) -> `Export::export` for `T` (`b/src/t.rs`), \
                    `export_described` [`order` (`r/src/ordered.rs`) -> `Stream::wait_for`: waits on `R`; \
                    `hf_record`: `recordStream(R)`]: then `Described` [`x`]";
        let s = step(line, 1).unwrap();
        assert_eq!(s.hops, 1);
        assert_eq!(s.callers, [name("Inputs::push", Some("a/src/inputs.rs"))]);
        assert_eq!(s.callees, [name("Export::export", Some("b/src/t.rs")), name("export_described", None)]);
        let sides: Vec<&str> = s.sides.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(sides, ["order", "Stream::wait_for", "hf_record", "x"]);
        assert_eq!(s.sides[0].file.as_deref(), Some("r/src/ordered.rs"));
        let two = step("29. to 30. `a`, `b` -> `m::a`, `L::finish`, as in 11 and 12", 1).unwrap();
        assert_eq!((two.hops, two.callers.len(), two.callees.len()), (2, 2, 2));
        assert_eq!(step("- `a` -> `b`", 1), None);
        assert_eq!(step("Counted: 12. `a` -> `b`", 1), None);
    }

    fn sources(files: &[(&str, &str)]) -> BTreeMap<String, Source> {
        files.iter().map(|(f, code)| (f.to_string(), Source::read(code))).collect()
    }

    const SOURCES: &[(&str, &str)] = &[
        ("k/src/kernel.rs", "impl Kernel { fn call(&self) {} }"),
        ("k/src/args.rs", "impl Args { fn visit(&self) {} } fn push() {}"),
        ("r/src/handoff.rs", "impl Handoff { pub fn from_desc() {} fn wrap() {} }"),
        ("r/src/reaper/home.rs", "pub(crate) fn here() {} #[cfg(test)] fn only_tested() {}"),
    ];

    fn check_text(text: &str) -> (Walk, Vec<String>) {
        let mut problems = Vec::new();
        let walk = check_walk(text, 0, &sources(SOURCES), &mut problems);
        (walk, problems)
    }

    #[test]
    fn the_walks_names_are_found_and_its_returns_counted() {
        let text = "Into it:\n\n\
                    1. `Kernel::call` (`k/src/kernel.rs`) -> `Args::visit` (`k/src/args.rs`), `push`\n\
                    2. `push` -> `Handoff::from_desc` (`r/src/handoff.rs`): a `Handoff` [`reaper::here`]\n\
                    3. `Kernel::call` -> `Args::visit`\n\
                    4. `Args::visit` -> `Handoff::wrap`\n\n\
                    - The end: `Handoff::from_desc` ->\n  `here` (`r/src/reaper/home.rs`)\n";
        let (walk, problems) = check_text(text);
        assert_eq!(problems, Vec::<String>::new());
        let returns = BTreeMap::from([("k/src/args.rs".to_string(), 1), ("r/src/handoff.rs".to_string(), 1)]);
        assert_eq!(walk, Walk { names: 12, with_file: 9, hops: 4, files: 3, returns });
    }

    #[test]
    fn the_stated_counts_are_those_read() {
        let walk = Walk { hops: 36, files: 16, ..Walk::default() };
        let mut problems = Vec::new();
        check_stated(
            "Counted: **36 hops** through **16 files**; **23 types**; 38 hops",
            &walk,
            &mut problems,
        );
        assert_eq!(problems, Vec::<String>::new());
        check_stated("Counted: **35 hops** through **16 files**", &walk, &mut problems);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].ends_with("states **35 hops**, but its numbered lines count 36"), "{problems:?}");
    }

    #[test]
    fn a_name_missing_from_its_file_is_an_error() {
        let text = "1. `Kernel::call` (`k/src/kernel.rs`) -> `Args::visit` (`r/src/handoff.rs`)\n\
                    2. `Args::visit` -> `Kernel::gone` [`only_tested`]\n\
                    - `Handoff::wrap` (`k/src/gone.rs`),\n  `reaper::from_desc`\n";
        let (walk, problems) = check_text(text);
        assert_eq!(
            problems,
            [
                "docs/ARCHITECTURE.md:1: `Args::visit` is given to `r/src/handoff.rs`, which does not have it \
                 (`fn visit`, `Args` named)",
                "docs/ARCHITECTURE.md:2: `Args::visit` is given to `r/src/handoff.rs`, which does not have it \
                 (`fn visit`, `Args` named)",
                "docs/ARCHITECTURE.md:2: `Kernel::gone`: no source file has it (`fn gone`, `Kernel` named)",
                "docs/ARCHITECTURE.md:2: `only_tested`: no source file has it (`fn only_tested`)",
                "docs/ARCHITECTURE.md:3: `Handoff::wrap` is given to `k/src/gone.rs`, which is not a source file read",
                "docs/ARCHITECTURE.md:4: `reaper::from_desc`: no source file has it (`fn from_desc`, `reaper` in its path)",
            ]
        );
        assert_eq!(walk.hops, 2);
    }
}
