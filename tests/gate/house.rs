//! The house's rules (docs/design.md, "Layout"), held against the code:
//! no two files of a crate import each other in a circle, the core reaches
//! neither actix nor tokio, and the node daemon imports neither the
//! orchestrator nor the replicas.
//!
//! Imports are read from the source text: every `use` of `crate::…`,
//! `super::…` or `self::…` (braces expanded) and every such path written
//! inline, outside the files' test modules, resolved to the file that
//! defines the module named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates' source roots, from the workspace's root.
const ROOTS: [&str; 3] = ["src", "actors/src", "core/src"];

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of `file` before its first `#[cfg(test)]` (its tests may
/// reach anywhere), comments left out (a doc link is no import).
fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let text = match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module path of `file` under `root`: `src/live/swim/member.rs` →
/// `["live", "swim", "member"]`; `mod.rs`, `lib.rs` and `main.rs` name
/// their folder.
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(root).unwrap_or(file);
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Every path a `use` statement names, braces expanded:
/// `super::{a, b::{c, d}}` → `super::a`, `super::b::c`, `super::b::d`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or("").trim().to_string()];
    };
    let prefix = &tree[..open];
    let inner = tree[open + 1..].trim_end().trim_end_matches('}');
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|item| !item.trim().is_empty())
        .flat_map(|item| expand(&format!("{prefix}{}", item.trim())))
        .collect()
}

/// The paths `text` names that start at `crate`, `super` or `self`, each
/// with whether a `pub use` names it (a re-export: the face of a module,
/// not something its code needs).
fn paths(text: &str) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    let mut rest = text;
    // `use` statements, braces and all.
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        let public = rest[..at].trim_end().ends_with("pub") || rest[..at].trim_end().ends_with(')');
        let statement = &rest[at + 4..];
        let end = statement.find(';').unwrap_or(statement.len());
        if before.is_none_or(|c| !c.is_alphanumeric() && c != '_') {
            found.extend(expand(&statement[..end]).into_iter().map(|p| (p, public)));
        }
        rest = &statement[end.min(statement.len())..];
    }
    // Paths written inline: `crate::a::b`, `super::a`.
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(start) {
            let begin = from + at;
            let end = text[begin..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(text.len(), |e| begin + e);
            found.push((text[begin..end].trim_end_matches(':').to_string(), false));
            from = end.max(begin + start.len());
        }
    }
    found
        .into_iter()
        .filter(|(p, _)| {
            p.starts_with("crate::") || p.starts_with("super::") || p.starts_with("self::")
        })
        .collect()
}

/// One crate's files and the files each imports.
struct Crate {
    root: PathBuf,
    modules: BTreeMap<Vec<String>, PathBuf>,
    imports: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
}

impl Crate {
    fn read(root: &Path) -> Crate {
        let mut files = Vec::new();
        sources(root, &mut files);
        let modules: BTreeMap<Vec<String>, PathBuf> = files
            .iter()
            .map(|f| (module_of(root, f), f.clone()))
            .collect();
        let mut krate = Crate {
            root: root.to_path_buf(),
            modules,
            imports: BTreeMap::new(),
        };
        for file in &files {
            let here = module_of(root, file);
            let targets: BTreeSet<PathBuf> = paths(&code(file))
                .iter()
                .filter_map(|(p, public)| Some((krate.resolve(&here, p)?, *public)))
                // A module re-exporting what its own submodules define
                // hands names on; it does not depend on them.
                .filter(|(target, public)| {
                    let below = module_of(root, target).starts_with(&here)
                        && module_of(root, target).len() > here.len();
                    !(*public && below)
                })
                .map(|(target, _)| target)
                .filter(|target| target != file)
                .collect();
            krate.imports.insert(file.clone(), targets);
        }
        krate
    }

    /// The file that defines the longest module prefix of `path`, written
    /// in the module `here`.
    fn resolve(&self, here: &[String], path: &str) -> Option<PathBuf> {
        let mut parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
        let mut base: Vec<String> = match parts.first()? {
            &"crate" => Vec::new(),
            &"self" | &"super" => {
                // A file's own module is `here`; a `mod.rs` is its folder's.
                let mut base = here.to_vec();
                if parts[0] == "super" {
                    base.pop();
                }
                while parts.get(1) == Some(&"super") {
                    base.pop();
                    parts.remove(0);
                }
                base
            }
            _ => return None,
        };
        let rest = &parts[1..];
        let mut best = None;
        if !base.is_empty() {
            best = self.modules.get(&base).cloned();
        }
        for part in rest {
            base.push((*part).to_string());
            match self.modules.get(&base) {
                Some(file) => best = Some(file.clone()),
                None => break,
            }
        }
        // A crate's root (lib.rs) re-exports; an import of it alone is not
        // an edge between rooms.
        best.filter(|f| !module_of(&self.root, f).is_empty())
    }

    /// The files that import one another in a circle (each group of
    /// strongly connected files larger than one).
    fn circles(&self) -> Vec<Vec<PathBuf>> {
        let files: Vec<&PathBuf> = self.imports.keys().collect();
        let reach = |from: &PathBuf| -> BTreeSet<PathBuf> {
            let mut seen = BTreeSet::new();
            let mut todo = vec![from.clone()];
            while let Some(f) = todo.pop() {
                for next in self.imports.get(&f).into_iter().flatten() {
                    if seen.insert(next.clone()) {
                        todo.push(next.clone());
                    }
                }
            }
            seen
        };
        let reaches: BTreeMap<&PathBuf, BTreeSet<PathBuf>> =
            files.iter().map(|f| (*f, reach(f))).collect();
        let mut circles: Vec<Vec<PathBuf>> = Vec::new();
        let mut placed = BTreeSet::new();
        for f in &files {
            if placed.contains(*f) || !reaches[f].contains(*f) {
                continue;
            }
            let group: Vec<PathBuf> = files
                .iter()
                .filter(|g| reaches[f].contains(**g) && reaches[*g].contains(*f))
                .map(|g| (*g).clone())
                .collect();
            placed.extend(group.iter().cloned());
            circles.push(group);
        }
        circles
    }
}

fn shown(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| {
            f.strip_prefix(workspace())
                .unwrap_or(f)
                .display()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn no_two_files_of_a_crate_import_each_other_in_a_circle() {
    for root in ROOTS {
        let krate = Crate::read(&workspace().join(root));
        assert!(krate.imports.len() > 5, "{root}: its files were not read");
        let circles = krate.circles();
        assert!(
            circles.is_empty(),
            "{root}: files importing one another in a circle: {}",
            circles
                .iter()
                .map(|c| format!("[{}]", shown(c)))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
}

#[test]
fn the_reader_of_imports_finds_a_circle_where_there_is_one() {
    // The check above would pass on a reader that finds no imports at all:
    // here it reads a crate of three files that import one another.
    let dir = std::env::temp_dir().join(format!("poolgate-house-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).expect("dir");
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod c;\n").expect("write");
    std::fs::write(
        dir.join("a/mod.rs"),
        "mod b;\nuse self::b::Thing;\nuse crate::c::{Other, more::Deep as D};\n",
    )
    .expect("write");
    std::fs::write(dir.join("a/b.rs"), "pub struct Thing;\n").expect("write");
    std::fs::write(
        dir.join("c.rs"),
        "pub struct Other;\nfn f() { let _ = super::a::b::Thing; }\n#[cfg(test)]\nmod t { use crate::a::b; }\n",
    )
    .expect("write");
    let krate = Crate::read(&dir);
    let circles = krate.circles();
    std::fs::remove_dir_all(&dir).expect("remove");
    // a → b, a → c, c → b (inline): no circle yet through b; c → a? No:
    // c names a::b, the longest module prefix, which is b.
    assert!(circles.is_empty(), "{circles:?}");
    let dir = std::env::temp_dir().join(format!("poolgate-house2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).expect("dir");
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod c;\n").expect("write");
    std::fs::write(dir.join("a/mod.rs"), "use crate::c::{Other};\n").expect("write");
    std::fs::write(dir.join("c.rs"), "use super::a::Thing;\n").expect("write");
    let krate = Crate::read(&dir);
    let circles = krate.circles();
    std::fs::remove_dir_all(&dir).expect("remove");
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert_eq!(circles[0].len(), 2, "{circles:?}");
}

#[test]
fn the_core_reaches_neither_actix_nor_tokio() {
    let mut files = Vec::new();
    sources(&workspace().join("core/src"), &mut files);
    assert!(!files.is_empty());
    for file in files {
        let text = code(&file);
        for runtime in ["actix", "tokio"] {
            assert!(
                !text.contains(&format!("{runtime}::")),
                "{} names {runtime}",
                file.display()
            );
        }
    }
    let manifest = std::fs::read_to_string(workspace().join("core/Cargo.toml")).expect("manifest");
    assert!(!manifest.contains("actix") && !manifest.contains("tokio"));
}

#[test]
fn the_node_daemon_imports_neither_the_orchestrator_nor_the_replicas() {
    let krate = Crate::read(&workspace().join("src"));
    let daemon = workspace().join("src/cli/node");
    let files: Vec<_> = krate
        .imports
        .keys()
        .filter(|f| f.starts_with(&daemon))
        .collect();
    assert!(files.len() >= 2, "src/cli/node/ is read: {files:?}");
    let imports: Vec<_> = files.iter().flat_map(|f| &krate.imports[*f]).collect();
    for forbidden in ["src/live/orchestrator", "src/ha"] {
        let forbidden = workspace().join(forbidden);
        assert!(
            forbidden.is_dir(),
            "{} is a folder of the house",
            forbidden.display()
        );
        assert!(
            !imports.iter().any(|i| i.starts_with(&forbidden)),
            "src/cli/node/ imports {}",
            forbidden.display()
        );
    }
    // It does import what a node needs: the reader sees its imports.
    assert!(
        imports.contains(&&workspace().join("src/live/wire.rs")),
        "{imports:?}"
    );
}
