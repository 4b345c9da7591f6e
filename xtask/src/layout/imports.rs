//! Imports by module path: a module names another module's item by that module's
//! path, not through the crate root's re-export of it; and no re-export renames one of
//! the crate's own items.

use std::collections::{BTreeMap, BTreeSet};

use super::tokens::{Token, is_ident, use_tree};
use super::{Crate, scan, slashed};

/// Checks every file of `c` (its code without `#[cfg(test)]` items); returns how many
/// paths from the crate root and how many re-exports it read.
pub(super) fn check(c: &Crate, problems: &mut Vec<String>) -> (usize, usize) {
    let (mut paths, mut reexports) = (0, 0);
    let modules: BTreeSet<&str> = c.modules.keys().map(String::as_str).collect();
    for f in &c.files {
        let file = slashed(&f.path);
        if !f.module.is_empty() {
            paths += through_root(&file, &f.code, f.module.len(), &modules, &c.reexports, problems);
        }
        reexports += renames(&file, &f.code, &modules, problems);
    }
    (paths, reexports)
}

/// Reports each path of `code` (a file at module depth `depth`, not the crate root)
/// that names an item through the crate root's re-export of it: `crate::Item`
/// (`$crate::Item`, or `super::Item` from a top-level module) where the root brings
/// `Item` in from one of its modules. A module of the root, or an item the root
/// defines itself, is no such path. Returns how many paths from the root it read.
fn through_root(
    file: &str,
    code: &[Token],
    depth: usize,
    modules: &BTreeSet<&str>,
    reexports: &BTreeMap<String, Vec<String>>,
    problems: &mut Vec<String>,
) -> usize {
    let paths = scan(code, depth).1;
    for (line, path) in &paths {
        let name = path[0].as_str();
        if modules.contains(name) {
            continue;
        }
        if let Some(from) = reexports.get(name) {
            problems.push(format!(
                "{file}:{line}: `{name}` is named through the crate root, which re-exports `{}`: \
                 name it by its module, `crate::{}`",
                from.join("::"),
                from.join("::"),
            ));
        }
    }
    paths.len()
}

/// Reports each `pub use` (`pub(crate) use`, any `pub(..)`) of `code` that brings one of
/// the crate's own items in under another name (`pub use home::here as home_here;`):
/// one name per item, so the item is renamed instead. Own: a path from `crate`,
/// `self` or `super`, or from a module of the crate or of the file. `as _` names
/// nothing; another crate's item may be renamed (there is no renaming it itself),
/// and so may a crate mounted as a module (`pub use handoff_torch as torch;`).
/// Returns how many re-exports it read.
fn renames(file: &str, code: &[Token], modules: &BTreeSet<&str>, problems: &mut Vec<String>) -> usize {
    let at = |i: usize| code.get(i).map_or("", |(_, t)| t.as_str());
    let declared: BTreeSet<&str> = (0..code.len()).filter(|&i| at(i) == "mod").map(|i| at(i + 1)).collect();
    let own = |first: &str| {
        matches!(first, "crate" | "self" | "super") || modules.contains(first) || declared.contains(first)
    };
    let mut read = 0;
    for i in (0..code.len()).filter(|&i| at(i) == "pub") {
        let mut j = i + 1;
        if at(j) == "(" {
            while !matches!(at(j), ")" | "") {
                j += 1;
            }
            j += 1;
        }
        if at(j) != "use" {
            continue;
        }
        let visibility: String = code[i..j].iter().map(|(_, t)| t.as_str()).collect();
        for leaf in use_tree(code, j + 1, &[]).0 {
            read += 1;
            let item = leaf.path.last().map_or("", String::as_str);
            let renamed = leaf.renamed && leaf.name != "_" && leaf.name != item && is_ident(&leaf.name);
            if renamed && own(&leaf.path[0]) {
                problems.push(format!(
                    "{file}:{}: `{visibility} use {} as {}` gives `{item}` a second name: \
                     rename `{item}` itself (one name per item)",
                    leaf.line,
                    leaf.path.join("::"),
                    leaf.name,
                ));
            }
        }
    }
    read
}

#[cfg(test)]
mod tests {
    use super::super::tokens::{tokens, without_test_items};
    use super::super::{reexports, scan};
    use super::*;

    /// The problems `through_root` finds in `code` at `depth`, the crate root being
    /// `root` and declaring the modules `modules`.
    fn through(root: &str, modules: &[&str], code: &str, depth: usize) -> Vec<String> {
        let modules: BTreeSet<&str> = modules.iter().copied().collect();
        let root = without_test_items(tokens(root));
        let declared: BTreeSet<String> = scan(&root, 0).0.into_iter().map(|(_, m)| m).collect();
        assert_eq!(declared, modules.iter().map(|m| m.to_string()).collect());
        let reexports = reexports(&root, |m| modules.contains(m));
        let mut problems = Vec::new();
        through_root(
            "a/src/m.rs",
            &without_test_items(tokens(code)),
            depth,
            &modules,
            &reexports,
            &mut problems,
        );
        problems
    }

    const ROOT: &str = "mod device;\nmod reaper;\npub use device::Device;\npub use reaper::{drain, home::here};\n\
                        pub use dlpark::Thing;\npub struct Own;\n";

    #[test]
    fn a_reexport_named_through_the_root_is_an_error() {
        let code = "use crate::Device;\nfn f() { crate::drain(); }\n\
                    macro_rules! m { () => { $crate::here() } }\nfn g() { super::Device::cpu(); }\n";
        assert_eq!(
            through(ROOT, &["device", "reaper"], code, 1),
            [
                "a/src/m.rs:1: `Device` is named through the crate root, which re-exports `device::Device`: \
                 name it by its module, `crate::device::Device`",
                "a/src/m.rs:2: `drain` is named through the crate root, which re-exports `reaper::drain`: \
                 name it by its module, `crate::reaper::drain`",
                "a/src/m.rs:3: `here` is named through the crate root, which re-exports `reaper::home::here`: \
                 name it by its module, `crate::reaper::home::here`",
                "a/src/m.rs:4: `Device` is named through the crate root, which re-exports `device::Device`: \
                 name it by its module, `crate::device::Device`",
            ]
        );
    }

    #[test]
    fn module_paths_and_the_roots_own_items_are_fine() {
        // Modules, the root's own items, another crate's items, a submodule's `super::`,
        // comments, strings and test items.
        let code = "use crate::device::Device;\nuse crate::{reaper::drain, Own, Thing};\n\
                    fn f() { super::Device::cpu(); } // crate::Device\nconst S: &str = \"crate::drain\";\n\
                    #[cfg(test)]\nmod tests { use crate::Device; }\n";
        assert!(through(ROOT, &["device", "reaper"], code, 2).is_empty());
    }

    fn renamed(code: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let modules = BTreeSet::from(["reaper"]);
        renames("a/src/m.rs", &without_test_items(tokens(code)), &modules, &mut problems);
        problems
    }

    #[test]
    fn a_reexport_renaming_an_own_item_is_an_error() {
        let code = "mod home;\npub(crate) use home::here as home_here;\n\
                    pub use crate::reaper::{drain, Drained as Done};\npub use self::x::Y as Z;\n";
        assert_eq!(
            renamed(code),
            [
                "a/src/m.rs:2: `pub(crate) use home::here as home_here` gives `here` a second name: \
                 rename `here` itself (one name per item)",
                "a/src/m.rs:3: `pub use crate::reaper::Drained as Done` gives `Drained` a second name: \
                 rename `Drained` itself (one name per item)",
                "a/src/m.rs:4: `pub use self::x::Y as Z` gives `Y` a second name: \
                 rename `Y` itself (one name per item)",
            ]
        );
    }

    #[test]
    fn other_renames_are_fine() {
        // A private alias, `as _`, another crate's item, a crate mounted as a module, a
        // re-export under its own name, a test item.
        let code = "use home::here as home_here;\npub use reaper::Trait as _;\n\
                    pub use dlpark::DlpackElement as Element;\npub mod adapters { pub use handoff_torch as torch; }\n\
                    pub use reaper::drain as drain;\n#[cfg(test)]\npub use reaper::x as y;\n";
        assert!(renamed(code).is_empty());
    }
}
