//! Parsing an `operation`: a bare tool name (`echo`), or qualified
//! (`demo.echo`, `demo.echo@1.2.3`, `demo.echo@1` meaning 1.0.0).

use semver::Version;

/// An operation as the agent wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperationName<'a> {
    Bare(&'a str),
    Qualified {
        toolset: &'a str,
        tool: &'a str,
        /// `None` means the latest registered version.
        version: Option<Version>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("operation must not be empty")]
    Empty,
    #[error("{0:?} is not a valid version (use 1, 1.2 or 1.2.3)")]
    BadVersion(String),
    #[error("no tool {0:?} is registered")]
    Unknown(String),
    #[error("tool name {name:?} is ambiguous: toolsets {toolsets:?} all define it; qualify it as Toolset.{name}")]
    Ambiguous { name: String, toolsets: Vec<String> },
}

/// Reads `1`, `1.2` or `1.2.3` (missing parts are zero).
pub fn parse_version(text: &str) -> Result<Version, ResolveError> {
    let parts = text.split('.').count();
    let padded = match parts {
        1 => format!("{text}.0.0"),
        2 => format!("{text}.0"),
        _ => text.to_owned(),
    };
    Version::parse(&padded).map_err(|_| ResolveError::BadVersion(text.to_owned()))
}

impl<'a> OperationName<'a> {
    /// Tool names cannot contain `.` or `@`, so the last `.` before an `@`
    /// separates the toolset from the tool.
    pub fn parse(operation: &'a str) -> Result<Self, ResolveError> {
        if operation.is_empty() {
            return Err(ResolveError::Empty);
        }
        let (name, version) = match operation.rsplit_once('@') {
            Some((name, v)) => (name, Some(parse_version(v)?)),
            None => (operation, None),
        };
        Ok(match name.rsplit_once('.') {
            Some((toolset, tool)) if !toolset.is_empty() && !tool.is_empty() => {
                OperationName::Qualified {
                    toolset,
                    tool,
                    version,
                }
            }
            _ if version.is_none() => OperationName::Bare(name),
            _ => return Err(ResolveError::Unknown(operation.to_owned())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names() {
        let v = |s: &str| Some(Version::parse(s).unwrap());
        let cases = [
            ("echo", Ok(OperationName::Bare("echo"))),
            (
                "demo.echo",
                Ok(OperationName::Qualified {
                    toolset: "demo",
                    tool: "echo",
                    version: None,
                }),
            ),
            (
                "Calculator.Add@1.0.0",
                Ok(OperationName::Qualified {
                    toolset: "Calculator",
                    tool: "Add",
                    version: v("1.0.0"),
                }),
            ),
            (
                "Calculator.Add@1",
                Ok(OperationName::Qualified {
                    toolset: "Calculator",
                    tool: "Add",
                    version: v("1.0.0"),
                }),
            ),
            (
                "Calculator.Add@1.2",
                Ok(OperationName::Qualified {
                    toolset: "Calculator",
                    tool: "Add",
                    version: v("1.2.0"),
                }),
            ),
            (
                "my.tools.run",
                Ok(OperationName::Qualified {
                    toolset: "my.tools",
                    tool: "run",
                    version: None,
                }),
            ),
            ("", Err(ResolveError::Empty)),
            ("a.b@x", Err(ResolveError::BadVersion("x".into()))),
            ("echo@1", Err(ResolveError::Unknown("echo@1".into()))),
        ];
        for (input, expected) in cases {
            assert_eq!(OperationName::parse(input), expected, "{input}");
        }
    }
}
