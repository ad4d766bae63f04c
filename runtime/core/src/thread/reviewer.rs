//! Who decides an approval. A person names themselves; Ferry's own
//! deciders (the approval's timeout, a standing grant, an ACP client's
//! answer) are variants of their own, so no name a person gives can pass
//! for one of them in the audit trail.

/// How the timeout's decisions are recorded.
const TIMEOUT: &str = "timeout";
/// How an ACP client's decisions are recorded.
const ACP: &str = "acp";
/// Starts the recorded reviewer of a decision a standing grant made
/// (`grant:` and the thread that holds it): an application of a grant,
/// never a grant of its own.
pub const GRANT_REVIEWER_PREFIX: &str = "grant:";

/// Longest reviewer name, in bytes: a name, not a document.
pub const MAX_REVIEWER_BYTES: usize = 256;

/// Who decided an approval. Recorded in `approval_decided`'s `reviewer` as
/// the person's name, `timeout`, `grant:<group_id>` or `acp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reviewer {
    /// A person, by the name they gave ([`Reviewer::person`] checks it).
    Person(String),
    /// No one decided before the approval's deadline: rejected.
    Timeout,
    /// A standing grant of thread `from` (this thread or an ancestor).
    Grant { from: String },
    /// An ACP client answered the permission request.
    Acp,
}

impl Reviewer {
    /// A person named `name`, or why Ferry cannot record that name: empty,
    /// one of Ferry's own deciders however written (`ＴＩＭＥＯＵＴ `,
    /// `grant:…`, `acp`), too long, or holding line breaks, control or
    /// invisible characters (a name holding one could pass for another:
    /// `acp` for `\u{200B}acp`).
    pub fn person(name: &str) -> Result<Self, String> {
        let reads = reading(name);
        if reads.is_empty()
            || reads == TIMEOUT
            || reads == ACP
            || reads.starts_with(GRANT_REVIEWER_PREFIX)
        {
            return Err(format!(
                "reviewer {name:?} is empty or reserved (\"{TIMEOUT}\", \"{ACP}\" and \"{GRANT_REVIEWER_PREFIX}…\" are Ferry's own)"
            ));
        }
        if name.len() > MAX_REVIEWER_BYTES {
            return Err(format!(
                "reviewer is {} bytes long; the limit is {MAX_REVIEWER_BYTES}",
                name.len()
            ));
        }
        // U+2028 and U+2029 are no control characters to Unicode, but line
        // breaks to a log line or a page.
        if name
            .chars()
            .any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
        {
            return Err(format!(
                "reviewer {name:?} contains control characters or line breaks"
            ));
        }
        if name.chars().any(is_invisible) {
            return Err(format!(
                "reviewer {name:?} contains invisible characters (zero-width, format or filler)"
            ));
        }
        Ok(Reviewer::Person(name.to_owned()))
    }

    /// The reviewer as `approval_decided` records it.
    pub fn recorded(&self) -> String {
        match self {
            Reviewer::Person(name) => name.clone(),
            Reviewer::Timeout => TIMEOUT.to_owned(),
            Reviewer::Grant { from } => format!("{GRANT_REVIEWER_PREFIX}{from}"),
            Reviewer::Acp => ACP.to_owned(),
        }
    }

    /// The reviewer `approval_decided` recorded as `text`. (Names that read
    /// as Ferry's own are refused before they are recorded, so the
    /// variants are told apart by their text.)
    pub fn from_recorded(text: &str) -> Self {
        match text {
            TIMEOUT => Reviewer::Timeout,
            ACP => Reviewer::Acp,
            _ => match text.strip_prefix(GRANT_REVIEWER_PREFIX) {
                Some(from) => Reviewer::Grant {
                    from: from.to_owned(),
                },
                None => Reviewer::Person(text.to_owned()),
            },
        }
    }
}

impl std::fmt::Display for Reviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.recorded())
    }
}

/// How a name reads: around it no whitespace, ASCII's fullwidth forms
/// (`ａｃｐ`) as ASCII, letters in one case. Invisible characters are
/// refused outright ([`is_invisible`]); letters of other scripts that look
/// like Latin ones are not caught.
fn reading(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFEE0).unwrap_or(c),
            c => c,
        })
        .collect::<String>()
        .trim()
        .to_ascii_lowercase()
}

/// Characters that show nothing (format characters such as zero-width
/// spaces, joiners, direction overrides and the byte-order mark; soft
/// hyphens; variation selectors; fillers).
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

#[cfg(test)]
mod tests {
    use super::Reviewer;

    #[test]
    fn names_are_recorded_unless_they_could_pass_for_ferrys_own() {
        for name in [
            "ana",
            "José Ñúñez",
            "李小龍",
            "O'Brien-Smith",
            "ops bot (night)",
            "acpx",
        ] {
            assert_eq!(Reviewer::person(name), Ok(Reviewer::Person(name.into())));
        }
        for name in [
            "",
            " ",
            "timeout",
            " TIMEOUT\t",
            "ｔｉｍｅｏｕｔ",
            "acp",
            "ａｃｐ ",
            "grant:x",
            "Ｇrant:x",
            "\u{200b}ana",
            "an\u{2060}a",
            "\u{e0061}ana",
            "ana\u{2028}ferry: approved",
            "ana\u{2029}",
            "ana\nbob",
        ] {
            assert!(Reviewer::person(name).is_err(), "{name:?}");
        }
        assert!(Reviewer::person(&"a".repeat(257)).is_err());
    }

    #[test]
    fn each_reviewer_reads_back_from_what_it_records() {
        for reviewer in [
            Reviewer::Person("ana".into()),
            Reviewer::Timeout,
            Reviewer::Grant {
                from: "parent".into(),
            },
            Reviewer::Acp,
        ] {
            assert_eq!(Reviewer::from_recorded(&reviewer.recorded()), reviewer);
        }
        assert_eq!(Reviewer::Grant { from: "g".into() }.recorded(), "grant:g");
    }
}
