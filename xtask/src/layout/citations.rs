//! The GPU logs ([`RUNS`]): every file there is cited, every cited path is
//! there, and there are at most [`MAX_LOGS`] files. The logs back the current results
//! (BENCHMARKS.md, docs/RELIABILITY.md); what they were before lives in git.
//!
//! A citation is a path under [`RUNS`] in the text of a Markdown file of the
//! repository (hidden folders, `target/`, the GPU bundle's folders and [`RUNS`] itself
//! left out) or of a Rust file under `xtask/src/`, and each file a script of
//! [`SCRIPTS`] reads: its `"dir"` joined with each name it passes to `json_lines`.
//! A citation names a file, a folder (every file under it) or a pattern whose `*`
//! stands for any part of one path segment (every file matching it, or under a folder
//! matching it). [`RUNS`] alone, with nothing after its `/`, cites nothing: it names
//! where the logs are. Trailing `.`, `,`, `;`, `:` and `)` end a sentence, not a path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::slashed;

/// The folder of the GPU logs, from the repository root.
pub(super) const RUNS: &str = "docs/gpu-runs";

/// The most files [`RUNS`] may hold, counted in every folder under it.
pub(super) const MAX_LOGS: usize = 100;

/// Scripts that read logs by name from one run's folder (`"dir": ...` and
/// `json_lines("name")`).
pub(super) const SCRIPTS: &[&str] = &["bench/readme_performance.py"];

/// Folders never searched for Markdown: build outputs and the GPU bundle's.
const SKIPPED: &[&str] = &["target", "gpu-bundle", "gpu-run"];

/// What the citation check read.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Citations {
    /// The files under [`RUNS`].
    pub logs: usize,
    /// The Markdown files read for citations, and the citations found in every file
    /// read (Markdown, Rust and the scripts).
    pub markdown: usize,
    pub cited: usize,
}

/// One citation: the file and line it is on, and the path it names (from the root).
#[derive(Debug, PartialEq)]
struct Cite {
    at: String,
    line: usize,
    path: String,
}

/// Reads the logs and every citing file under `root` and checks them.
pub(super) fn check(root: &Path, problems: &mut Vec<String>) -> Citations {
    let mut logs = Vec::new();
    files_under(root, Path::new(RUNS), &mut logs);
    let mut logs: Vec<String> = logs.iter().map(|p| slashed(p)).collect();
    logs.sort();
    let mut citing = Vec::new();
    markdown(root, Path::new(""), &mut citing);
    let markdown = citing.len();
    super::walk(root, Path::new("xtask/src"), "rs", &mut citing);
    let mut cites = Vec::new();
    for file in &citing {
        let name = slashed(file);
        match std::fs::read_to_string(root.join(file)) {
            Ok(text) => {
                cites.extend(cited_in(&text).into_iter().map(|(line, path)| Cite {
                    at: name.clone(),
                    line,
                    path,
                }));
            }
            Err(e) => problems.push(format!("{name}: cannot read it: {e}")),
        }
    }
    for script in SCRIPTS {
        match std::fs::read_to_string(root.join(script)) {
            Ok(text) => {
                let read = script_reads(&text);
                if read.is_empty() {
                    problems.push(format!(
                        "{script}: no `\"dir\": \"{RUNS}/...\"` with `json_lines(\"...\")` names found: \
                         the files it reads are its citations"
                    ));
                }
                cites.extend(read.into_iter().map(|(line, path)| Cite {
                    at: script.to_string(),
                    line,
                    path,
                }));
            }
            Err(e) => problems.push(format!("{script}: cannot read it: {e}")),
        }
    }
    judge(&logs, &cites, problems);
    Citations { logs: logs.len(), markdown, cited: cites.len() }
}

/// Every file under `dir`, in every folder.
fn files_under(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return };
    for entry in entries.flatten() {
        let rel = dir.join(entry.file_name());
        match entry.file_type() {
            Ok(t) if t.is_dir() => files_under(root, &rel, out),
            _ => out.push(rel),
        }
    }
}

/// Every `.md` file under `dir`, but for hidden folders, [`SKIPPED`] ones and [`RUNS`].
fn markdown(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return };
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = dir.join(&name);
        let searched = !name.starts_with('.') && !SKIPPED.contains(&name.as_str()) && slashed(&rel) != RUNS;
        match entry.file_type() {
            Ok(t) if t.is_dir() && searched => markdown(root, &rel, out),
            Ok(t) if t.is_file() && name.ends_with(".md") => out.push(rel),
            _ => {}
        }
    }
}

/// The paths under [`RUNS`] that `text` names, each with its line (from 1).
fn cited_in(text: &str) -> Vec<(usize, String)> {
    let prefix = format!("{RUNS}/");
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find(&prefix) {
            let after = &rest[at + prefix.len()..];
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || "._-/*+".contains(c)))
                .unwrap_or(after.len());
            let path = after[..len].trim_end_matches(['.', ',', ';', ':', ')']);
            if !path.is_empty() {
                out.push((i + 1, format!("{prefix}{path}")));
            }
            rest = &after[len..];
        }
    }
    out
}

/// The files a script reads, each with the line of the name: its `"dir"` (a path
/// under [`RUNS`]) joined with each string it passes to `json_lines(`.
fn script_reads(text: &str) -> Vec<(usize, String)> {
    let quoted = |s: &str| s.strip_prefix('"').and_then(|s| s.split('"').next()).map(str::to_string);
    let dir = text.lines().find_map(|l| {
        let value = l.trim().strip_prefix("\"dir\":")?.trim();
        quoted(value).filter(|d| d.starts_with(&format!("{RUNS}/")))
    });
    let Some(dir) = dir else { return Vec::new() };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        for call in line.split("json_lines(").skip(1) {
            if let Some(name) = quoted(call) {
                out.push((i + 1, format!("{dir}/{name}")));
            }
        }
    }
    out
}

/// Whether `pattern` (its `*` any run of characters but `/`) matches all of `text`.
fn matches(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            let Some(rest) = text.strip_prefix(head) else { return false };
            // The star takes 0, 1, ... characters, never a `/`.
            let mut taken = 0;
            loop {
                if matches(tail, &rest[taken..]) {
                    return true;
                }
                match rest[taken..].chars().next() {
                    Some(c) if c != '/' => taken += c.len_utf8(),
                    _ => return false,
                }
            }
        }
    }
}

/// Whether a citation `path` cites the log `file`: it is the file, a folder above it,
/// or a pattern matching either.
fn cites(path: &str, file: &str) -> bool {
    let path = path.trim_end_matches('/');
    let mut at = file.len();
    loop {
        if matches(path, &file[..at]) {
            return true;
        }
        match file[..at].rfind('/') {
            Some(slash) => at = slash,
            None => return false,
        }
    }
}

/// The problems of `logs` (files under [`RUNS`], from the root) against `cites`.
fn judge(logs: &[String], cites: &[Cite], problems: &mut Vec<String>) {
    let mut cited = BTreeSet::new();
    for c in cites {
        let found: Vec<&String> = logs.iter().filter(|f| self::cites(&c.path, f)).collect();
        if found.is_empty() {
            problems.push(format!(
                "{}:{}: cites `{}`, which is not in {RUNS}/ (a log it relies on was deleted, or the path is wrong)",
                c.at, c.line, c.path
            ));
        }
        cited.extend(found);
    }
    for log in logs.iter().filter(|l| !cited.contains(l)) {
        problems.push(format!(
            "{log}: cited by no document: cite it where the figures it backs are, or delete it (git keeps it)"
        ));
    }
    if logs.len() > MAX_LOGS {
        problems.push(format!(
            "{RUNS}/: {} files, more than {MAX_LOGS}: keep only the logs of the current results",
            logs.len()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cite(at: &str, line: usize, path: &str) -> Cite {
        Cite { at: at.into(), line, path: format!("{RUNS}/{path}") }
    }

    fn logs(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| format!("{RUNS}/{n}")).collect()
    }

    #[test]
    fn citations_are_read_from_text() {
        let text = format!(
            "Logs: `{RUNS}/a-run1/` and {RUNS}/b.log.\n\
             x ({RUNS}/c-*.log), `{RUNS}/d/e.txt`; and the folder {RUNS}/ itself.\n\
             let run = \"{RUNS}/f\";"
        );
        let found: Vec<(usize, String)> = cited_in(&text);
        let want: Vec<(usize, String)> =
            [(1, "a-run1/"), (1, "b.log"), (2, "c-*.log"), (2, "d/e.txt"), (3, "f")]
                .iter()
                .map(|(l, p)| (*l, format!("{RUNS}/{p}")))
                .collect();
        assert_eq!(found, want);
    }

    #[test]
    fn a_script_cites_the_files_it_reads_from_its_run() {
        let text = format!(
            "RUN = {{\n    \"dir\": \"{RUNS}/r2\",\n}}\n\
             a = json_lines(\"one.out\")\nb = [x for x in json_lines(\"two.log\") if json_lines(\"three\")]\n"
        );
        let want: Vec<(usize, String)> = [(4, "r2/one.out"), (5, "r2/two.log"), (5, "r2/three")]
            .iter()
            .map(|(l, p)| (*l, format!("{RUNS}/{p}")))
            .collect();
        assert_eq!(script_reads(&text), want);
        assert!(script_reads("json_lines(\"one.out\")").is_empty(), "no run, no citation");
    }

    #[test]
    fn files_folders_and_patterns_cite() {
        let f = format!("{RUNS}/run6/graph/gpu-logs/train.log");
        for path in ["run6", "run6/", "run6/graph/gpu-logs/train.log", "run*/graph", "run6/*/gpu-logs/t*.log"]
        {
            assert!(cites(&format!("{RUNS}/{path}"), &f), "{path}");
        }
        for path in ["run", "run6/graph/gpu-logs/train", "run6/*.log", "run6/graph/gpu-logs/x*"] {
            assert!(!cites(&format!("{RUNS}/{path}"), &f), "{path}");
        }
    }

    #[test]
    fn every_log_cited_and_every_citation_present_passes() {
        let logs = logs(&["a.log", "b-1.log", "b-2.log", "run/x.txt", "run/y/z.txt"]);
        let cites = [
            cite("BENCHMARKS.md", 3, "a.log"),
            cite("docs/R.md", 9, "b-*.log"),
            cite("README.md", 1, "run/"),
        ];
        let mut problems = Vec::new();
        judge(&logs, &cites, &mut problems);
        assert_eq!(problems, Vec::<String>::new());
    }

    #[test]
    fn an_uncited_log_and_a_missing_citation_are_named() {
        let logs = logs(&["a.log", "run/x.txt", "run/y.txt"]);
        let cites = [
            cite("BENCHMARKS.md", 3, "a.log"),
            cite("BENCHMARKS.md", 4, "run/x.txt"),
            cite("docs/R.md", 7, "gone-*.log"),
        ];
        let mut problems = Vec::new();
        judge(&logs, &cites, &mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with(&format!("docs/R.md:7: cites `{RUNS}/gone-*.log`")), "{problems:?}");
        assert!(problems[1].starts_with(&format!("{RUNS}/run/y.txt: cited by no document")), "{problems:?}");
    }

    #[test]
    fn more_than_the_most_logs_is_an_error() {
        let names: Vec<String> = (0..=MAX_LOGS).map(|i| format!("run/{i}.log")).collect();
        let logs: Vec<String> = names.iter().map(|n| format!("{RUNS}/{n}")).collect();
        let mut problems = Vec::new();
        judge(&logs, &[cite("BENCHMARKS.md", 1, "run")], &mut problems);
        assert_eq!(
            problems,
            [format!(
                "{RUNS}/: {} files, more than {MAX_LOGS}: keep only the logs of the current results",
                MAX_LOGS + 1
            )]
        );
    }

    #[test]
    fn a_tree_is_read_with_the_logs_own_files_and_hidden_folders_left_out() {
        let root = std::env::temp_dir().join(format!("xtask-citations-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let write = |path: &str, text: &str| {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(&format!("{RUNS}/a.log"), "");
        write(&format!("{RUNS}/b.log"), "");
        write(&format!("{RUNS}/run/tables.md"), &format!("{RUNS}/b.log"));
        write(".hidden/notes.md", &format!("{RUNS}/b.log"));
        write("target/doc.md", &format!("{RUNS}/b.log"));
        write("README.md", &format!("Logs: `{RUNS}/a.log`, `{RUNS}/gone.log`.\n"));
        write(
            "bench/readme_performance.py",
            &format!("RUN = {{\n    \"dir\": \"{RUNS}/run\",\n}}\njson_lines(\"tables.md\")\n"),
        );
        let mut problems = Vec::new();
        let read = check(&root, &mut problems);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(read, Citations { logs: 3, markdown: 1, cited: 3 });
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with(&format!("README.md:1: cites `{RUNS}/gone.log`")), "{problems:?}");
        assert!(problems[1].starts_with(&format!("{RUNS}/b.log: cited by no document")), "{problems:?}");
    }
}
