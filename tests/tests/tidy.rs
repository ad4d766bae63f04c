//! Checks of the tree itself, in the spirit of rust-analyzer's tidy tests:
//! the crates depend only downwards, the native API's error statuses are
//! chosen in one table, the README stays short, ARCHITECTURE.md maps every
//! crate, and comments say why the code is so rather than who found what.

use std::fs;
use std::path::{Path, PathBuf};

/// The workspace's root (this crate lives in `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Every file under `dir` whose name ends with one of `suffixes`, skipping
/// build output and installed tools.
fn files(dir: &Path, suffixes: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | "node_modules" | ".git") {
                    pending.push(path);
                }
            } else if suffixes.iter().any(|s| name.ends_with(s)) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn shown(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The layers, lowest first: a crate may depend on crates of lower layers
/// only (`ops`, which composes the binary, and the tests see every one).
const LAYERS: &[(&str, &str, u8)] = &[
    ("ferry-proto", "proto", 0),
    ("ferry-core", "runtime/core", 1),
    ("ferry-dispatch", "worker", 1),
    ("ferry-store", "runtime/store", 2),
    ("ferry-store-sled", "runtime/store-sled", 3),
    ("ferry-engine", "runtime/engine", 3),
    ("ferry-nats", "runtime/nats", 4),
    ("ferry-fronts", "runtime/fronts", 4),
    ("ferry-ops", "ops", 5),
    ("ferry-tests", "tests", 6),
];

/// Crates that do I/O or run tasks, which the pure layers must not use.
const IO_CRATES: &[&str] = &[
    "tokio",
    "reqwest",
    "axum",
    "hyper",
    "sled",
    "async-nats",
    "tokio-stream",
];

/// The dependencies a manifest lists: each name, and whether it is a
/// dev-dependency (for the crate's own tests only).
fn dependencies(manifest: &str) -> Vec<(String, bool)> {
    let mut section = None;
    let mut names = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = match line {
                "[dependencies]" => Some(false),
                "[dev-dependencies]" => Some(true),
                _ => None,
            };
        } else if let Some(dev) = section.filter(|_| !line.is_empty() && !line.starts_with('#')) {
            let name = line.split(['=', '.', ' ']).next().unwrap_or("");
            names.push((name.to_owned(), dev));
        }
    }
    names
}

#[test]
fn each_crate_depends_only_on_lower_layers() {
    let layer_of = |name: &str| LAYERS.iter().find(|(n, _, _)| *n == name).map(|l| l.2);
    let mut wrong = Vec::new();
    for (name, dir, layer) in LAYERS {
        let path = root().join(dir).join("Cargo.toml");
        let manifest = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{dir}: {e}"));
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{dir} is not {name}"
        );
        for (dep, dev) in dependencies(&manifest) {
            match layer_of(&dep) {
                // A crate's own tests may use a crate beside it (the
                // engine's, the sled store), never one above it.
                Some(other) if other > *layer || (other == *layer && !dev) => wrong.push(format!(
                    "{name} (layer {layer}) depends on {dep} (layer {other})"
                )),
                // A test tool server in a crate's own tests is no layer.
                _ if dev => {}
                _ if dep == "axum" && *layer < 5 && *name != "ferry-fronts" => wrong.push(format!(
                    "{name} knows HTTP serving (axum): only the fronts do"
                )),
                // Each backend has one adapter crate (ops composes them).
                _ if dep == "sled" && *name != "ferry-store-sled" => wrong.push(format!(
                    "{name} depends on sled: only ferry-store-sled opens it"
                )),
                _ if dep == "async-nats" && *layer < 5 && *name != "ferry-nats" => wrong.push(
                    format!("{name} depends on async-nats: only ferry-nats speaks NATS"),
                ),
                _ if matches!(*name, "ferry-proto" | "ferry-core")
                    && IO_CRATES.contains(&dep.as_str()) =>
                {
                    wrong.push(format!("{name} is pure, yet depends on {dep}"))
                }
                _ => {}
            }
        }
    }
    // Every crate of the workspace has its layer.
    let workspace = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    for (_, dir, _) in LAYERS {
        assert!(
            workspace.contains(&format!("\"{dir}\"")),
            "{dir} is not a member"
        );
    }
    let members = workspace.split("members = [").nth(1).unwrap();
    let members = &members[..members.find(']').unwrap()];
    assert_eq!(
        members.matches('"').count() / 2,
        LAYERS.len(),
        "a workspace member has no layer in LAYERS: {members}"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `StatusCode::NAME` constants of 2xx and 3xx statuses, which any handler
/// may answer with; every other status is an error's.
const SUCCESS_STATUSES: &[&str] = &[
    "OK",
    "CREATED",
    "ACCEPTED",
    "NO_CONTENT",
    "SEE_OTHER",
    "FOUND",
    "NOT_MODIFIED",
];

/// The `StatusCode::NAME`s named in `text`.
fn status_names(text: &str) -> Vec<&str> {
    text.match_indices("StatusCode::")
        .map(|(at, m)| {
            let rest = &text[at + m.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|name| !name.is_empty())
        .collect()
}

#[test]
fn error_statuses_are_chosen_in_one_table() {
    let runtime = root().join("runtime");
    let table = runtime.join("fronts/src/http/error.rs");
    let mut wrong = Vec::new();
    for path in files(&runtime, &[".rs"]) {
        let text = fs::read_to_string(&path).unwrap();
        let in_fronts = path.starts_with(runtime.join("fronts"));
        // (NATS has status codes of its own: `async_nats::StatusCode`.)
        let http_status = text.contains("http::StatusCode") || text.contains("reqwest::StatusCode");
        if !in_fronts && http_status {
            wrong.push(format!(
                "{}: HTTP statuses belong to the fronts",
                shown(&path)
            ));
        }
        // The native API: every error answer takes its status from
        // `status_of(ErrorCode)`. (MCP, OXP and ACP answer in their own
        // protocols' shapes, each defined in its front.)
        if path.starts_with(runtime.join("fronts/src/http")) && path != table {
            for name in status_names(&text) {
                if !SUCCESS_STATUSES.contains(&name) {
                    wrong.push(format!(
                        "{}: StatusCode::{name}: use ApiError::new(ErrorCode, ..) or status_of",
                        shown(&path)
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_readme_stays_a_short_page() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; at most 300: reference goes to docs/"
    );
}

/// Why `line` (lower-cased) tells a comment's history rather than its
/// reason, if it does: who noticed what, or in which numbered work
/// session. History belongs in commit messages. (The words are written
/// apart so that this file passes its own check.)
fn provenance(line: &str) -> Option<String> {
    let review = "review";
    let mut words: Vec<String> = ["a", "the", "one", "an earlier", "black-box"]
        .iter()
        .map(|w| format!("{w} {review}"))
        .collect();
    for verb in ["saw", "found", "caught", "got", "measured", "showed"] {
        words.push(format!("{review} {verb}"));
    }
    words.push(format!("found {}", "by"));
    // Whole words only: "reviewer" names a role, and is no provenance.
    let whole = |w: &str| {
        line.match_indices(w).any(|(at, _)| {
            let next = line[at + w.len()..].chars().next();
            !next.is_some_and(|c| c.is_alphanumeric())
        })
    };
    if let Some(word) = words.into_iter().find(|w| whole(w)) {
        return Some(word);
    }
    // An ordinal or "helper" before the word: which session, not why.
    let session = " session";
    line.match_indices(session).find_map(|(at, _)| {
        let before = line[..at].rsplit(' ').next().unwrap_or("");
        let ordinal = before.ends_with("th") || matches!(before, "first" | "second" | "third");
        let which = matches!(before, "helper" | "earlier" | "previous");
        (ordinal || which).then(|| format!("{before}{session}"))
    })
}

#[test]
fn comments_say_why_not_who_found_it() {
    let mut wrong = Vec::new();
    for dir in ["proto", "runtime", "worker", "ops", "tests", ".ci"] {
        for path in files(&root().join(dir), &[".rs", ".toml", ".sh", "run", ".html"]) {
            let text = fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                let trimmed = line.trim_start();
                let comment = trimmed.starts_with("//")
                    || trimmed.starts_with('#')
                    || trimmed.starts_with("<!--");
                if let Some(word) = provenance(&line.to_lowercase()).filter(|_| comment) {
                    wrong.push(format!(
                        "{}:{}: {word:?}: {}",
                        shown(&path),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "provenance in comments:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_architecture_maps_every_crate() {
    let map = fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let missing: Vec<String> = LAYERS
        .iter()
        .map(|(name, dir, _)| format!("### `{dir}/` (`{name}`"))
        .filter(|heading| !map.contains(heading.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map lacks: {}",
        missing.join(", ")
    );
}
