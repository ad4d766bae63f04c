//! All-or-nothing validation of a manifest (`rap-3`: "an invalid toolset
//! makes none of its tools available"), and argument validation against a
//! tool's compiled `inputSchema`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::Validator;
use serde_json::map::Entry;
use serde_json::{Map, Value};

use ferry_proto::rap::Manifest;

use super::StoredToolset;

/// A validated toolset with each tool's schema compiled once.
pub struct LoadedToolset {
    pub stored: StoredToolset,
    pub validators: HashMap<String, Arc<Validator>>,
}

/// Everything wrong with a manifest, one line each.
pub type Problems = Vec<String>;

fn valid_tool_name(name: &str) -> bool {
    (1..=128).contains(&name.chars().count())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Checks every rule of the manifest and compiles every schema; any problem
/// refuses the whole toolset.
pub fn validate(stored: StoredToolset) -> Result<LoadedToolset, Problems> {
    let m = &stored.manifest;
    let mut problems = Problems::new();
    let name_len = m.name.chars().count();
    if !(1..=128).contains(&name_len) {
        problems.push(format!("name must be 1-128 characters, got {name_len}"));
    }
    if m.name.contains('@') || m.name.chars().any(char::is_control) {
        problems.push("name must not contain '@' or control characters".into());
    }
    if m.name == "." || m.name == ".." {
        // URL normalisation removes these as path segments, even
        // percent-encoded: `/v1/toolsets/{name}` could never reach it.
        problems.push(format!(
            "name must not be {:?}: it cannot be addressed in a URL path",
            m.name
        ));
    }
    match url::Url::parse(&m.endpoint) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => {}
        _ => problems.push(format!("endpoint {:?} is not an http(s) URL", m.endpoint)),
    }
    if m.tools.is_empty() {
        problems.push("a toolset needs at least one tool".into());
    }
    let mut seen = HashSet::new();
    let mut validators = HashMap::new();
    for tool in &m.tools {
        if !valid_tool_name(&tool.name) {
            problems.push(format!(
                "tool name {:?} must be 1-128 letters, digits, '_' or '-'",
                tool.name
            ));
        }
        if !seen.insert(tool.name.as_str()) {
            problems.push(format!("tool name {:?} appears twice", tool.name));
        }
        if !tool.input_schema.is_object() {
            problems.push(format!(
                "tool {:?}: inputSchema must be a JSON object",
                tool.name
            ));
            continue;
        }
        if !allows_objects(&tool.input_schema) {
            // Arguments are an object (rap-1): such a tool could never be
            // called.
            problems.push(format!(
                "tool {:?}: inputSchema must describe an object (its \"type\" leaves out \"object\")",
                tool.name
            ));
            continue;
        }
        match jsonschema::validator_for(&tool.input_schema) {
            Ok(v) => {
                validators.insert(tool.name.clone(), Arc::new(v));
            }
            Err(e) => problems.push(format!("tool {:?}: invalid inputSchema: {e}", tool.name)),
        }
    }
    if let Err(problem) = stored.policy.check() {
        problems.push(problem);
    }
    if problems.is_empty() {
        Ok(LoadedToolset { stored, validators })
    } else {
        Err(problems)
    }
}

/// Rules that Ferry enforces on a manifest as a server publishes it now
/// (at registration and refresh), not on toolsets stored by earlier
/// builds, which would otherwise vanish from the registry at start.
pub fn check_published(m: &Manifest) -> Result<(), Problems> {
    let mut problems = Problems::new();
    for tool in &m.tools {
        let Some(annotations) = &tool.annotations else {
            continue;
        };
        // rap-3: "custom keys namespaced `x-…`".
        for key in annotations.extra.keys().filter(|k| !k.starts_with("x-")) {
            problems.push(format!(
                "tool {:?}: annotation {key:?} is not one of requiresAuth, readOnly, destructive, idempotent, longRunning, and a custom one must start with \"x-\"",
                tool.name
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Whether a schema's top-level `type`, if it has one, admits an object.
fn allows_objects(schema: &Value) -> bool {
    match schema.get("type") {
        None => true,
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(types)) => types.iter().any(|t| t == "object"),
        Some(_) => false,
    }
}

/// Argument errors keyed by the argument's path (`b`, `items/0`), or
/// `arguments` for the object as a whole.
pub type ArgumentErrors = Map<String, Value>;

/// Validates `arguments`, naming each offending parameter in plain words
/// and never echoing the value back.
pub fn check_arguments(validator: &Validator, arguments: &Value) -> Result<(), ArgumentErrors> {
    let mut errors = ArgumentErrors::new();
    // rap-1: `arguments` is an object, whatever a permissive schema says.
    if !arguments.is_object() {
        errors.insert("arguments".into(), "must be an object".into());
        return Err(errors);
    }
    for error in validator.iter_errors(arguments) {
        let path = error.instance_path.to_string();
        let path = path.trim_start_matches('/');
        let under = |name: &str| {
            if path.is_empty() {
                name.to_owned()
            } else {
                format!("{path}/{name}")
            }
        };
        let found: Vec<(String, String)> = match &error.kind {
            ValidationErrorKind::Required { property } => {
                let name = property
                    .as_str()
                    .map_or_else(|| property.to_string(), str::to_owned);
                vec![(under(&name), "is required".to_owned())]
            }
            // Keyed by the parameters given, as the others are.
            ValidationErrorKind::AdditionalProperties { unexpected } => unexpected
                .iter()
                .map(|name| (under(name), "is not a parameter of this tool".to_owned()))
                .collect(),
            ValidationErrorKind::Type { kind } => {
                let expected = match kind {
                    TypeKind::Single(t) => article(&t.to_string()),
                    TypeKind::Multiple(ts) => format!("one of {ts:?}"),
                };
                vec![(path.to_owned(), format!("must be {expected}"))]
            }
            _ => vec![(path.to_owned(), error.masked().to_string())],
        };
        for (key, message) in found {
            let key = if key.is_empty() {
                "arguments".to_owned()
            } else {
                key
            };
            // Two errors at one place (the arguments as a whole, and a
            // parameter named `arguments`, say) are both kept.
            match errors.entry(key) {
                Entry::Vacant(vacant) => {
                    vacant.insert(Value::String(message));
                }
                Entry::Occupied(mut occupied) => {
                    if let Value::String(said) = occupied.get_mut() {
                        if !said.split("; ").any(|m| m == message) {
                            said.push_str("; ");
                            said.push_str(&message);
                        }
                    }
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn article(type_name: &str) -> String {
    match type_name {
        "object" | "array" | "integer" => format!("an {type_name}"),
        "null" => "null".to_owned(),
        other => format!("a {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(schema: Value, args: Value, expected: Value) {
        let v = jsonschema::validator_for(&schema).unwrap();
        let got = match check_arguments(&v, &args) {
            Ok(()) => json!({}),
            Err(e) => Value::Object(e),
        };
        assert_eq!(got, expected);
    }

    #[test]
    fn a_published_annotation_is_a_rap_one_or_namespaced_x() {
        let manifest = |annotations: Value| -> Manifest {
            serde_json::from_value(json!({
                "name": "T", "endpoint": "http://h/invoke",
                "tools": [{"name": "t", "description": "d", "inputSchema": {},
                           "annotations": annotations}]
            }))
            .unwrap()
        };
        let good = json!({"requiresAuth": "github", "readOnly": true, "destructive": false,
                          "idempotent": true, "longRunning": true, "x-anything": [1]});
        assert_eq!(check_published(&manifest(good)), Ok(()));
        let problems =
            check_published(&manifest(json!({"title": "T", "x-ok": 1, "X-upper": 2}))).unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("\"X-upper\""), "{problems:?}");
        assert!(problems[1].contains("\"title\""), "{problems:?}");
    }

    #[test]
    fn arguments_are_an_object_even_under_a_permissive_schema() {
        for args in [json!(null), json!("x"), json!([1]), json!(3)] {
            check(json!({}), args, json!({"arguments": "must be an object"}));
        }
        check(json!({}), json!({"any": 1}), json!({}));
    }

    #[test]
    fn argument_errors_name_the_parameter() {
        let schema = json!({
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"},
                           "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["a", "b"],
            "additionalProperties": false
        });
        check(schema.clone(), json!({"a": 1, "b": 2}), json!({}));
        check(
            schema.clone(),
            json!({"a": 1, "b": "x"}),
            json!({"b": "must be a number"}),
        );
        check(schema.clone(), json!({"a": 1}), json!({"b": "is required"}));
        check(
            schema.clone(),
            json!({"a": 1, "b": 2, "tags": [3]}),
            json!({"tags/0": "must be a string"}),
        );
        check(
            schema.clone(),
            json!([1]),
            json!({"arguments": "must be an object"}),
        );
        check(
            schema.clone(),
            json!({"a": 1, "b": 2, "zz": 1, "yy": 2}),
            json!({"zz": "is not a parameter of this tool", "yy": "is not a parameter of this tool"}),
        );
    }

    /// A parameter named `arguments` shares its key with errors about the
    /// arguments as a whole: both are said, neither dropped for the other.
    #[test]
    fn errors_at_one_key_are_all_kept() {
        let schema = json!({
            "type": "object",
            "properties": {"arguments": {"type": "string"}},
            "required": ["arguments"],
            "minProperties": 2
        });
        let got = check_arguments(
            &jsonschema::validator_for(&schema).unwrap(),
            &json!({"x": 1}),
        )
        .unwrap_err();
        let said = got["arguments"].as_str().unwrap();
        assert!(said.contains("is required"), "{said}");
        assert!(said.contains("; "), "{said}");
    }
}
