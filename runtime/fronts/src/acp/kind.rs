//! A tool call's ACP `title` and `kind` (ToolKind), from the tool's name
//! and its RAP annotations.

use ferry_proto::rap::Annotations;

/// Name keywords, most specific first, and the kind they suggest.
const KEYWORDS: &[(&[&str], &str)] = &[
    (
        &["delete", "drop", "remove", "destroy", "purge", "erase"],
        "delete",
    ),
    (&["move", "rename"], "move"),
    (&["search", "find", "query", "grep", "lookup"], "search"),
    (&["fetch", "download", "http", "url", "web"], "fetch"),
    (
        &["edit", "write", "update", "patch", "diff", "create", "set"],
        "edit",
    ),
    (
        &["run", "exec", "shell", "command", "deploy", "script"],
        "execute",
    ),
    (&["think", "plan", "reason"], "think"),
    (
        &["read", "get", "list", "show", "view", "echo", "cat"],
        "read",
    ),
];

/// The bare tool name of `Toolset.tool@version`.
pub fn bare_name(qualified: &str) -> &str {
    let name = qualified.split('@').next().unwrap_or(qualified);
    name.rsplit('.').next().unwrap_or(name)
}

/// The ToolKind: a read-only tool is `read` unless its name says it
/// searches, fetches or thinks; a destructive one `delete` unless its name
/// says it moves, edits or executes; otherwise the name decides, else
/// `other`.
pub fn kind(tool: &str, annotations: Option<&Annotations>) -> &'static str {
    let words: Vec<String> = bare_name(tool)
        .split(|c: char| !c.is_ascii_alphanumeric())
        .map(str::to_ascii_lowercase)
        .collect();
    let by_name = KEYWORDS
        .iter()
        .find(|(keys, _)| words.iter().any(|w| keys.contains(&w.as_str())))
        .map(|(_, kind)| *kind);
    let read_only = annotations.and_then(|a| a.read_only).unwrap_or(false);
    let destructive = annotations.and_then(|a| a.destructive).unwrap_or(false);
    match by_name {
        Some(k @ ("search" | "fetch" | "think" | "read")) if read_only => k,
        _ if read_only => "read",
        Some(k @ ("delete" | "move" | "edit" | "execute")) if destructive => k,
        _ if destructive => "delete",
        Some(k) => k,
        None => "other",
    }
}

/// A human title: `Drop table (demo)` for `demo.drop_table@1.0.0`.
pub fn title(tool: &str) -> String {
    let bare = bare_name(tool);
    let words = bare.replace(['_', '-'], " ");
    let mut chars = words.chars();
    let human = match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => tool.to_owned(),
    };
    let toolset = tool
        .split('@')
        .next()
        .and_then(|n| n.rsplit_once('.'))
        .map(|(ts, _)| ts);
    match toolset {
        Some(ts) => format!("{human} ({ts})"),
        None => human,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_from_names_and_annotations() {
        let ann = |read_only, destructive| Annotations {
            read_only: Some(read_only),
            destructive: Some(destructive),
            ..Annotations::default()
        };
        assert_eq!(
            kind("demo.drop_table@1.0.0", Some(&ann(false, true))),
            "delete"
        );
        assert_eq!(kind("ops.deploy@1.0.0", Some(&ann(false, true))), "execute");
        assert_eq!(kind("ops.nuke@1.0.0", Some(&ann(false, true))), "delete");
        assert_eq!(
            kind("kb.search_docs@1.0.0", Some(&ann(true, false))),
            "search"
        );
        assert_eq!(
            kind("kb.delete_preview@1.0.0", Some(&ann(true, false))),
            "read"
        );
        assert_eq!(kind("demo.diff@1.0.0", None), "edit");
        assert_eq!(kind("demo.sleep@1.0.0", None), "other");
        assert_eq!(title("demo.drop_table@1.0.0"), "Drop table (demo)");
        assert_eq!(title("cancel_subscription"), "Cancel subscription");
    }
}
