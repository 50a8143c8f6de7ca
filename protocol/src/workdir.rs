//! Working-directory URIs: absolute `file:` URIs, compared in canonical form.
//!
//! Two spellings of one directory (`file:///a%20b/`, `file:///a b`,
//! `file:///x/../a%20b`) must be one entry, or a client could add the same
//! directory twice or slip past the primary-directory rules. Every URI the host
//! accepts is rewritten to its canonical form before it reaches a reducer or
//! the transcript.

use std::fmt::Write as _;

/// Why a working-directory URI was refused; the message is shown to people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkdirError {
    /// Not a `file:` URI.
    #[error("working directory {0:?} must be a file: URI (for example file:///home/me/project)")]
    NotFile(String),
    /// A `file:` URI naming a remote host or a relative path.
    #[error("working directory {0:?} must be an absolute local path (file:///...)")]
    NotAbsolute(String),
    /// Broken percent-encoding or a path that is not UTF-8.
    #[error("working directory {0:?} is not a valid URI: {1}")]
    Malformed(String, &'static str),
}

/// The canonical spelling of an absolute `file:` URI: `file://` followed by
/// the absolute path with `.` and `..` resolved, no trailing slash (except
/// for `/`), and only characters outside `A-Za-z0-9-._~/` percent-encoded.
pub fn canonical_file_uri(uri: &str) -> Result<String, WorkdirError> {
    Ok(encode(&file_uri_path(uri)?))
}

/// The absolute, normalised local path an absolute `file:` URI names.
pub fn file_uri_path(uri: &str) -> Result<String, WorkdirError> {
    let rest = uri
        .strip_prefix("file:")
        .ok_or_else(|| WorkdirError::NotFile(uri.to_owned()))?;
    // `file:///p` (empty authority), `file://localhost/p`, or `file:/p`.
    let path = if let Some(after) = rest.strip_prefix("//") {
        let (host, path) = after.split_at(after.find('/').unwrap_or(after.len()));
        if !(host.is_empty() || host.eq_ignore_ascii_case("localhost")) {
            return Err(WorkdirError::NotAbsolute(uri.to_owned()));
        }
        path
    } else {
        rest
    };
    if !path.starts_with('/') || path.contains(['?', '#']) {
        return Err(WorkdirError::NotAbsolute(uri.to_owned()));
    }
    let decoded = decode(path).map_err(|why| WorkdirError::Malformed(uri.to_owned(), why))?;
    Ok(normalise(&decoded))
}

/// Whether `path` is an absolute path (the ACP form of a directory).
pub fn is_absolute_path(path: &str) -> bool {
    path.starts_with('/')
}

/// The `file:` URI of an absolute path, canonical.
pub fn path_to_file_uri(path: &str) -> Result<String, WorkdirError> {
    if !is_absolute_path(path) {
        return Err(WorkdirError::NotAbsolute(path.to_owned()));
    }
    Ok(encode(&normalise(path)))
}

fn normalise(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    let mut out = String::with_capacity(path.len());
    for part in &parts {
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

fn decode(input: &str) -> Result<String, &'static str> {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or("truncated percent-escape")?;
            let hex = std::str::from_utf8(hex).map_err(|_| "bad percent-escape")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| "bad percent-escape")?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let decoded = String::from_utf8(out).map_err(|_| "path is not UTF-8")?;
    if decoded.contains('\0') {
        return Err("path contains a NUL byte");
    }
    Ok(decoded)
}

fn encode(path: &str) -> String {
    let mut out = String::with_capacity(path.len() + 7);
    out.push_str("file://");
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_directory_agree() {
        let canonical = "file:///home/me/a%20b";
        for spelling in [
            "file:///home/me/a%20b",
            "file:///home/me/a b",
            "file:///home/me/a%20b/",
            "file:///home/me/x/../a%20b",
            "file:///home//me/./a%20b",
            "file://localhost/home/me/a%20b",
            "file:/home/me/a%20b",
            "file:///home/%6De/a%20b",
        ] {
            assert_eq!(
                canonical_file_uri(spelling).unwrap(),
                canonical,
                "{spelling}"
            );
        }
        assert_eq!(canonical_file_uri("file:///").unwrap(), "file:///");
        assert_eq!(canonical_file_uri("file:///..").unwrap(), "file:///");
        assert_eq!(file_uri_path("file:///a%20b/c").unwrap(), "/a b/c");
        assert_eq!(path_to_file_uri("/a b/").unwrap(), "file:///a%20b");
    }

    #[test]
    fn non_file_relative_and_broken_uris_are_refused() {
        assert!(matches!(
            canonical_file_uri("https://x/y"),
            Err(WorkdirError::NotFile(_))
        ));
        assert!(matches!(
            canonical_file_uri("/plain/path"),
            Err(WorkdirError::NotFile(_))
        ));
        assert!(matches!(
            canonical_file_uri("file:relative/p"),
            Err(WorkdirError::NotAbsolute(_))
        ));
        assert!(matches!(
            canonical_file_uri("file://server/share"),
            Err(WorkdirError::NotAbsolute(_))
        ));
        assert!(matches!(
            canonical_file_uri("file:///a%2"),
            Err(WorkdirError::Malformed(..))
        ));
        assert!(matches!(
            canonical_file_uri("file:///a%00b"),
            Err(WorkdirError::Malformed(..))
        ));
        assert!(matches!(
            canonical_file_uri("file:///a?x=1"),
            Err(WorkdirError::NotAbsolute(_))
        ));
    }
}
