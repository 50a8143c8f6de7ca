//! The host's own file access on a session's behalf: an agent's
//! `fs/read_text_file` and `fs/write_text_file`, and a client's revert of
//! a changeset. Held to the session's working directories as the agent's
//! confinement holds the agent: a path is resolved (symlinks followed, as
//! far as it exists) and must lie inside one of them; nothing else is
//! read or written, whatever `..` or links say.

use std::path::{Component, Path, PathBuf};

/// The largest text file the host reads or writes for a session.
pub const MAX_TEXT_BYTES: u64 = 16 * 1024 * 1024;

/// A session's directories, resolved: the only places its files are.
#[derive(Debug, Clone)]
pub struct SessionFiles {
    dirs: Vec<PathBuf>,
}

impl SessionFiles {
    /// The files under `dirs` (each resolved; those that no longer exist
    /// are left out).
    pub fn new(dirs: &[PathBuf]) -> Self {
        Self {
            dirs: dirs
                .iter()
                .filter_map(|d| std::fs::canonicalize(d).ok())
                .collect(),
        }
    }

    /// `path` resolved and checked: absolute, without `..`, and inside one
    /// of the directories once its existing part is resolved.
    pub fn resolve(&self, path: &Path) -> Result<PathBuf, String> {
        let shown = path.display();
        if !path.is_absolute() {
            return Err(format!("{shown} is not an absolute path."));
        }
        if path.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(format!(
                "{shown} goes up with \"..\"; name the file directly."
            ));
        }
        // The deepest part that exists, resolved, then the rest as given.
        let mut existing = path.to_path_buf();
        let mut rest = Vec::new();
        let resolved = loop {
            match std::fs::canonicalize(&existing) {
                Ok(resolved) => break resolved,
                Err(_) => {
                    // A link to nowhere would be followed by a write.
                    if std::fs::symlink_metadata(&existing).is_ok_and(|m| m.is_symlink()) {
                        return Err(format!(
                            "{shown} is a link to nothing; the host does not follow it."
                        ));
                    }
                    let Some(name) = existing.file_name().map(|n| n.to_owned()) else {
                        return Err(format!("{shown} cannot be resolved."));
                    };
                    rest.push(name);
                    if !existing.pop() {
                        return Err(format!("{shown} cannot be resolved."));
                    }
                }
            }
        };
        let full = rest.iter().rev().fold(resolved, |p, name| p.join(name));
        if self.dirs.iter().any(|dir| full.starts_with(dir)) {
            Ok(full)
        } else {
            Err(format!(
                "{shown} is outside this session's working directories; the host reads and \
                 writes only inside them."
            ))
        }
    }

    /// A text file's content, from 1-based `line`, at most `limit` lines.
    pub fn read_text(
        &self,
        path: &Path,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> Result<String, String> {
        let resolved = self.resolve(path)?;
        let text = read_bounded(&resolved)?
            .ok_or_else(|| format!("{} does not exist.", path.display()))?;
        if line.is_none() && limit.is_none() {
            return Ok(text);
        }
        let skip = line.map_or(0, |l| l.saturating_sub(1) as usize);
        let take = limit.map_or(usize::MAX, |l| l as usize);
        Ok(text.split_inclusive('\n').skip(skip).take(take).collect())
    }

    /// Writes `content` to a text file (its directory made if need be);
    /// its text before, `None` when it did not exist.
    pub fn write_text(&self, path: &Path, content: &str) -> Result<Option<String>, String> {
        if content.len() as u64 > MAX_TEXT_BYTES {
            return Err(format!(
                "{} would be {} bytes; the host writes at most {MAX_TEXT_BYTES}.",
                path.display(),
                content.len()
            ));
        }
        let resolved = self.resolve(path)?;
        let old = read_bounded(&resolved)?;
        if let Some(parent) = resolved.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("{} cannot be made: {e}.", parent.display()))?;
        }
        std::fs::write(&resolved, content)
            .map_err(|e| format!("{} cannot be written: {e}.", path.display()))?;
        Ok(old)
    }

    /// Puts a file back as it was (`before`; `None`: it did not exist, so
    /// it is removed), provided it is still as it was left (`after`;
    /// `None`: removed). A file changed since is refused, untouched.
    pub fn revert(
        &self,
        path: &Path,
        after: Option<&[u8]>,
        before: Option<&[u8]>,
    ) -> Result<(), String> {
        let resolved = self.check_unchanged(path, after)?;
        match before {
            Some(bytes) => {
                if let Some(parent) = resolved.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| format!("{} cannot be made: {e}.", parent.display()))?;
                }
                std::fs::write(&resolved, bytes)
                    .map_err(|e| format!("{} cannot be written: {e}.", path.display()))
            }
            None => match std::fs::remove_file(&resolved) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(format!("{} cannot be removed: {e}.", path.display())),
            },
        }
    }

    /// `path` resolved, if its content is still `after` (`None`: absent).
    pub fn check_unchanged(&self, path: &Path, after: Option<&[u8]>) -> Result<PathBuf, String> {
        let resolved = self.resolve(path)?;
        let now = match std::fs::read(&resolved) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("{} cannot be read: {e}.", path.display())),
        };
        if now.as_deref() != after {
            return Err(format!(
                "{} changed since the agent's edit; it is left as it is.",
                path.display()
            ));
        }
        Ok(resolved)
    }
}

/// A file's text, `None` when it does not exist; refused past
/// [`MAX_TEXT_BYTES`] or when it is not UTF-8.
fn read_bounded(path: &Path) -> Result<Option<String>, String> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Err(format!("{shown} is a directory.")),
        Ok(meta) if meta.len() > MAX_TEXT_BYTES => {
            return Err(format!(
                "{shown} is {} bytes; the host reads at most {MAX_TEXT_BYTES}.",
                meta.len()
            ));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{shown} cannot be read: {e}.")),
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{shown} cannot be read: {e}."))?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| format!("{shown} is not UTF-8 text."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sessions_directories_are_reached() {
        let inside = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path(), inside.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("none"), inside.path().join("dangling"))
            .unwrap();
        let files = SessionFiles::new(&[inside.path().to_path_buf()]);
        let new = inside.path().join("sub/new.txt");
        assert_eq!(files.write_text(&new, "one\ntwo\n").unwrap(), None);
        assert_eq!(
            files.write_text(&new, "three\n").unwrap().as_deref(),
            Some("one\ntwo\n")
        );
        assert_eq!(files.read_text(&new, None, None).unwrap(), "three\n");
        for bad in [
            outside.path().join("secret"),
            inside.path().join("link/secret"),
            inside.path().join("dangling"),
            inside.path().join("sub/../../x"),
            PathBuf::from("relative"),
        ] {
            assert!(
                files.read_text(&bad, None, None).is_err(),
                "{}",
                bad.display()
            );
            assert!(files.write_text(&bad, "x").is_err(), "{}", bad.display());
        }
        assert_eq!(
            std::fs::read_to_string(outside.path().join("secret")).unwrap(),
            "s"
        );
        assert!(!outside.path().join("none").exists());
    }

    #[test]
    fn lines_are_counted_from_one() {
        let dir = tempfile::tempdir().unwrap();
        let files = SessionFiles::new(&[dir.path().to_path_buf()]);
        let path = dir.path().join("f");
        files.write_text(&path, "a\nb\nc\n").unwrap();
        assert_eq!(files.read_text(&path, Some(2), Some(1)).unwrap(), "b\n");
        assert_eq!(files.read_text(&path, Some(3), None).unwrap(), "c\n");
    }

    #[test]
    fn a_revert_refuses_a_file_changed_since() {
        let dir = tempfile::tempdir().unwrap();
        let files = SessionFiles::new(&[dir.path().to_path_buf()]);
        let path = dir.path().join("f");
        std::fs::write(&path, "new").unwrap();
        assert!(files.revert(&path, Some(b"other"), Some(b"old")).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        files.revert(&path, Some(b"new"), Some(b"old")).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        files.revert(&path, Some(b"old"), None).unwrap();
        assert!(!path.exists());
    }
}
