//! The tokenizer the layout check reads Rust with: just enough for module paths and
//! use trees. Comments, strings and `#[cfg(test)]` items are left out.

/// A token of Rust code and its line: an identifier, `::`, or any other character
/// but whitespace; comments, strings and character literals are left out.
pub(super) type Token = (usize, String);

/// One leaf of a use tree (or a path): `a::b::C as D` is the path `[a, b, C]`
/// bringing in the name `D`, renamed.
#[derive(Debug, PartialEq)]
pub(super) struct Leaf {
    pub path: Vec<String>,
    pub name: String,
    /// The line of the path's last segment.
    pub line: usize,
    /// Whether it is brought in under another name (`as D`; `as _` too).
    pub renamed: bool,
}

/// Parses the use tree (or path) at `code[i..]` under `prefix`: its leaves
/// (`a::{b::C as D, e}` gives `[a, b, C]` as `D` and `[a, e]` as `e`), and where it
/// ends.
pub(super) fn use_tree(code: &[Token], mut i: usize, prefix: &[String]) -> (Vec<Leaf>, usize) {
    let at = |i: usize| code.get(i).map_or("", |(_, t)| t.as_str());
    let (mut leaves, mut path, mut line) = (Vec::new(), prefix.to_vec(), 0);
    while is_ident(at(i)) {
        path.push(at(i).to_string());
        line = code[i].0;
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
        let renamed = at(i) == "as";
        if renamed {
            name = at(i + 1).to_string();
            i += 2;
        } else if name == "self" && path.len() > 1 {
            path.pop();
            name = path.last().cloned().unwrap_or_default();
        }
        leaves.push(Leaf { path, name, line, renamed });
    }
    (leaves, i)
}

pub(super) fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_alphabetic() || c == '_')
        && t.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The tokens of Rust source `text` (see [`Token`]). A lifetime's quote is dropped,
/// its name kept.
pub(super) fn tokens(text: &str) -> Vec<Token> {
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
pub(super) fn without_test_items(code: Vec<Token>) -> Vec<Token> {
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
