//! Identifier rules shared by session ids, project names and working-context
//! session names.
//!
//! One rule for all three keeps URLs, AHP URIs and database keys free of
//! escaping: `[A-Za-z0-9._:-]`, 1 to 128 characters.

/// The longest accepted identifier, in bytes (all accepted characters are
/// ASCII, so bytes and characters agree).
pub const MAX_NAME_LEN: usize = 128;

/// The identifier rule as an ECMA-262 regular expression, as the OpenAPI
/// document states it. utoipa's attributes take only literals, so the
/// document repeats this text; a test keeps the two equal.
pub const NAME_PATTERN: &str = "^[A-Za-z0-9._:-]{1,128}$";

/// Why a name was refused; each message names the rule so a caller can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is empty.
    #[error("{kind} must not be empty")]
    Empty {
        /// What was being named ("session id", "project", ...).
        kind: &'static str,
    },
    /// The name is longer than [`MAX_NAME_LEN`].
    #[error("{kind} is {len} characters long; at most {MAX_NAME_LEN} are allowed")]
    TooLong {
        /// What was being named.
        kind: &'static str,
        /// The length that was given.
        len: usize,
    },
    /// The name holds a character outside `[A-Za-z0-9._:-]`.
    #[error("{kind} contains {found:?}; only letters, digits and . _ : - are allowed")]
    BadCharacter {
        /// What was being named.
        kind: &'static str,
        /// The first offending character.
        found: char,
    },
}

/// Checks `name` against the identifier rule, naming it `kind` in the error.
pub fn validate_name(kind: &'static str, name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { kind });
    }
    // Byte by byte: every allowed character is ASCII, so the first byte
    // refused starts the first character refused (a multi-byte character
    // begins with a byte of 0x80 or more, never allowed).
    if let Some(at) = name.bytes().position(|b| !is_name_byte(b)) {
        let found = name[at..].chars().next().unwrap_or_default();
        return Err(NameError::BadCharacter { kind, found });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong {
            kind,
            len: name.len(),
        });
    }
    Ok(())
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_allowed_alphabet() {
        assert_eq!(validate_name("project", "Team-1.core_x:y"), Ok(()));
        assert_eq!(validate_name("project", &"a".repeat(MAX_NAME_LEN)), Ok(()));
    }

    #[test]
    fn refuses_empty_long_and_foreign_characters() {
        assert_eq!(
            validate_name("project", ""),
            Err(NameError::Empty { kind: "project" })
        );
        assert_eq!(
            validate_name("project", &"a".repeat(MAX_NAME_LEN + 1)),
            Err(NameError::TooLong {
                kind: "project",
                len: MAX_NAME_LEN + 1
            })
        );
        let err = validate_name("session id", "a/b").unwrap_err();
        assert_eq!(
            err.to_string(),
            "session id contains '/'; only letters, digits and . _ : - are allowed"
        );
        assert!(validate_name("project", "é").is_err());
        // The character refused is named whole, even when it takes bytes.
        assert_eq!(
            validate_name("chat id", "ab\u{e9}c"),
            Err(NameError::BadCharacter {
                kind: "chat id",
                found: '\u{e9}'
            })
        );
    }

    #[test]
    fn the_pattern_states_the_rule() {
        // The documented pattern, read literally: one class and the length.
        let class = "A-Za-z0-9._:-";
        assert_eq!(NAME_PATTERN, format!("^[{class}]{{1,{MAX_NAME_LEN}}}$"));
        for b in 0_u8..=255 {
            let c = char::from(b);
            let in_class = b < 128 && (c.is_ascii_alphanumeric() || "._:-".contains(c));
            assert_eq!(is_name_byte(b), in_class, "{b:#x}");
        }
    }
}
