//! The cycles of each crate's module graph, against those the document lists.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::{CYCLES_SECTION, Crate, DOC, section};

/// Checks every crate's cycles against those the document lists.
pub(super) fn check_cycles(crates: &[Crate], doc: &str, problems: &mut Vec<String>) {
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
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
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
fn cycle_in(graph: &BTreeMap<String, BTreeSet<String>>, component: &[String]) -> Vec<String> {
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

    #[test]
    fn listed_cycles_are_read_from_their_lines() {
        let section =
            "Intro `x` <-> `y`.\n\n- `runtime/src/lib.rs`: `device` <-> `error`: why (`z` <-> `w`)\n";
        let set: BTreeSet<String> = ["device", "error"].map(String::from).into();
        assert_eq!(listed_cycles(section), BTreeSet::from([("runtime/src/lib.rs".to_string(), set)]));
    }
}
