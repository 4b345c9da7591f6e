//! The README ([`README`]), read in five minutes: the first ```` ```rust ```` and the
//! first ```` ```python ```` example both end within its first [`FIRST_LINES`] lines,
//! it holds at most [`WORD_BUDGET`] words, and [`DOCTESTS`] still compiles its Rust
//! examples as doctests.
//!
//! Words are counted as `wc -w` counts them: runs of characters between whitespace, in
//! the whole file (code, tables and the generated performance block included). A
//! fence is a line that starts with three or more backticks; its language is the first
//! word of the info string (```` ```rust no_run ````: `rust`); it closes at a line of
//! at least as many backticks and nothing else.

use std::path::Path;

/// The README, from the repository root.
pub(super) const README: &str = "README.md";

/// The line by which both first examples must have ended.
pub(super) const FIRST_LINES: usize = 60;

/// The most words the README may hold (about half of the 5,055 it held before it was
/// restructured).
pub(super) const WORD_BUDGET: usize = 2_500;

/// The crate whose doctests are the README's Rust blocks, and the line that makes them so.
pub(super) const DOCTESTS: &str = "examples/src.rs";
const INCLUDE: &str = "#[doc = include_str!(\"../README.md\")]";

/// The languages whose first example must come early.
const FIRST: [&str; 2] = ["rust", "python"];

/// What the check read.
#[derive(Debug, PartialEq)]
pub(super) struct Readme {
    pub words: usize,
    /// For each language of [`FIRST`], the lines its first block opens and closes on.
    pub first: Vec<(&'static str, Option<(usize, usize)>)>,
}

impl Readme {
    /// What was read, in one line.
    pub fn summary(&self) -> String {
        let ends: Vec<String> = (self.first.iter())
            .map(|(lang, at)| format!("{lang} at line {}", at.map_or(0, |(_, close)| close)))
            .collect();
        format!(
            "{README}: {} words (budget {WORD_BUDGET}); its first examples end by line {FIRST_LINES} ({}); \
             its Rust blocks are doctests of {DOCTESTS}",
            self.words,
            ends.join(", ")
        )
    }
}

/// Reads the README and [`DOCTESTS`] under `root` and checks them.
pub(super) fn check(root: &Path, problems: &mut Vec<String>) -> Readme {
    match std::fs::read_to_string(root.join(DOCTESTS)) {
        Ok(code) if code.contains(INCLUDE) => {}
        Ok(_) => problems.push(format!(
            "{DOCTESTS}: no `{INCLUDE}`: the README's Rust examples would no longer be compiled"
        )),
        Err(e) => problems.push(format!("{DOCTESTS}: cannot read it: {e}")),
    }
    match std::fs::read_to_string(root.join(README)) {
        Ok(text) => judge(&text, problems),
        Err(e) => {
            problems.push(format!("{README}: cannot read it: {e}"));
            Readme { words: 0, first: FIRST.iter().map(|l| (*l, None)).collect() }
        }
    }
}

/// Checks the README's `text`, adding a problem for each rule it breaks.
fn judge(text: &str, problems: &mut Vec<String>) -> Readme {
    let blocks = blocks(text);
    let mut first = Vec::new();
    for lang in FIRST {
        let found = blocks.iter().find(|b| b.lang == lang).map(|b| (b.open, b.close));
        match found {
            None => problems.push(format!(
                "{README}: no ```{lang} block: the first {FIRST_LINES} lines must show a {lang} example"
            )),
            Some((open, close)) if close > FIRST_LINES => problems.push(format!(
                "{README}:{open}: the first ```{lang} example ends at line {close}, past line {FIRST_LINES}: \
                 both first examples belong on the first screen"
            )),
            Some(_) => {}
        }
        first.push((lang, found));
    }
    if let Some(b) = blocks.iter().find(|b| b.close == 0) {
        problems.push(format!("{README}:{}: a ```{} block that never closes", b.open, b.lang));
    }
    let words = text.split_whitespace().count();
    if words > WORD_BUDGET {
        problems.push(format!(
            "{README}: {words} words, over the budget of {WORD_BUDGET} (xtask/src/layout/readme.rs): \
             move details into the documents it links"
        ));
    }
    Readme { words, first }
}

/// A fenced code block: its language and the lines (from 1) of its opening and closing
/// fences (`close` 0: never closed).
#[derive(Debug, PartialEq)]
struct Block {
    lang: String,
    open: usize,
    close: usize,
}

/// The fenced code blocks of `text`, in order.
fn blocks(text: &str) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    // The open block's fence length, while one is open.
    let mut open: Option<usize> = None;
    for (i, line) in text.lines().enumerate() {
        let ticks = line.len() - line.trim_start_matches('`').len();
        match open {
            Some(n) if ticks >= n && line[ticks..].trim().is_empty() => {
                if let Some(b) = out.last_mut() {
                    b.close = i + 1;
                }
                open = None;
            }
            None if ticks >= 3 => {
                let lang = line[ticks..].split([' ', ',', '\t']).next().unwrap_or_default();
                out.push(Block { lang: lang.to_string(), open: i + 1, close: 0 });
                open = Some(ticks);
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A README whose first Rust example opens at `rust_at` and first Python example at
    /// `python_at` (lines from 1, each block three lines long), padded with `words`
    /// one-word lines at the end.
    fn readme(rust_at: usize, python_at: usize, words: usize) -> String {
        let mut lines = vec!["x".to_string(); rust_at.max(python_at) + 3];
        lines[0] = "# t".into();
        for (at, fence) in [(rust_at, "```rust no_run"), (python_at, "```python")] {
            lines[at - 1] = fence.into();
            lines[at] = "code".into();
            lines[at + 1] = "```".into();
        }
        lines.extend(std::iter::repeat_n("w".to_string(), words));
        lines.join("\n")
    }

    #[test]
    fn examples_on_the_first_screen_within_the_budget_pass() {
        let text = readme(10, 20, 100);
        let mut problems = Vec::new();
        let read = judge(&text, &mut problems);
        assert_eq!(problems, Vec::<String>::new());
        assert_eq!(read.first, [("rust", Some((10, 12))), ("python", Some((20, 22)))]);
        assert_eq!(read.words, text.split_whitespace().count());
    }

    #[test]
    fn an_example_that_ends_past_the_first_lines_is_named() {
        let mut problems = Vec::new();
        judge(&readme(10, FIRST_LINES - 1, 0), &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(&format!(
                "README.md:{}: the first ```python example ends at line {}",
                FIRST_LINES - 1,
                FIRST_LINES + 1
            )),
            "{problems:?}"
        );
        // Ending on the last line allowed passes.
        let mut problems = Vec::new();
        judge(&readme(FIRST_LINES - 2, 10, 0), &mut problems);
        assert_eq!(problems, Vec::<String>::new());
    }

    #[test]
    fn a_missing_example_and_one_inside_another_block_are_not_taken() {
        // A ```python line inside a ```text block is the block's content, not a fence.
        let text = "# t\n```text\n```python\n```\n```rust\nfn f() {}\n```\n";
        let mut problems = Vec::new();
        let read = judge(text, &mut problems);
        assert_eq!(read.first, [("rust", Some((5, 7))), ("python", None)]);
        assert_eq!(
            problems,
            [format!(
                "README.md: no ```python block: the first {FIRST_LINES} lines must show a python example"
            )]
        );
    }

    #[test]
    fn a_block_left_open_is_named() {
        let mut problems = Vec::new();
        judge(&format!("{}\n```sh\nls\n", readme(2, 6, 0)), &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("a ```sh block that never closes"), "{problems:?}");
    }

    #[test]
    fn words_over_the_budget_are_counted_and_named() {
        let text = readme(2, 6, WORD_BUDGET);
        let words = text.split_whitespace().count();
        assert!(words > WORD_BUDGET);
        let mut problems = Vec::new();
        assert_eq!(judge(&text, &mut problems).words, words);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(&format!("README.md: {words} words, over the budget of {WORD_BUDGET}")),
            "{problems:?}"
        );
    }

    #[test]
    fn fences_take_their_language_from_the_first_word() {
        let text = "````rust,no_run\n```\n````\n```python cuda\nx\n```\n```\nplain\n```\n";
        let got: Vec<(String, usize, usize)> =
            blocks(text).into_iter().map(|b| (b.lang, b.open, b.close)).collect();
        assert_eq!(got, [("rust".into(), 1, 3), ("python".into(), 4, 6), (String::new(), 7, 9)]);
    }
}
