//! The allowed roots (`--allowed-roots`): where working directories may
//! be. One rule for every side-effect backend and for agent starts: a
//! directory is resolved (symlinks followed) and must exist, be a
//! directory and lie inside a root. With no roots set, only the `local`
//! backend asks that it exist.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tether_protocol::workdir::file_uri_path;

/// The allowed roots, resolved; cheap to clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roots {
    roots: Arc<[PathBuf]>,
}

impl Roots {
    /// Roots resolved now (a root that does not exist is kept as given
    /// and matches nothing real).
    pub fn new(roots: &[PathBuf]) -> Self {
        Self {
            roots: roots
                .iter()
                .map(|root| std::fs::canonicalize(root).unwrap_or_else(|_| root.clone()))
                .collect(),
        }
    }

    /// Whether no roots are set (any directory may be used).
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// The roots, resolved.
    pub fn list(&self) -> &[PathBuf] {
        &self.roots
    }

    /// A working directory's `file:` URI resolved: it must exist and be a
    /// directory, and lie inside a root when roots are set.
    pub fn resolve_uri(&self, uri: &str) -> Result<PathBuf, String> {
        let path = file_uri_path(uri).map_err(|e| e.to_string())?;
        self.resolve(Path::new(&path))
    }

    /// A working directory resolved (see [`Roots::resolve_uri`]).
    pub fn resolve(&self, path: &Path) -> Result<PathBuf, String> {
        let shown = path.display();
        let resolved = std::fs::canonicalize(path)
            .map_err(|_| format!("Working directory {shown} does not exist on this host."))?;
        let metadata = std::fs::metadata(&resolved)
            .map_err(|e| format!("Working directory {shown} cannot be read: {e}."))?;
        if !metadata.is_dir() {
            return Err(format!("Working directory {shown} is not a directory."));
        }
        if !self.roots.is_empty() && !self.roots.iter().any(|root| resolved.starts_with(root)) {
            return Err(format!(
                "Working directory {shown} is outside the allowed roots ({}); ask the operator \
                 to add it to TETHER_ALLOWED_ROOTS.",
                self.display()
            ));
        }
        Ok(resolved)
    }

    /// [`Roots::resolve_uri`] off the async threads (it touches the disk).
    pub async fn check_uri(&self, uri: &str) -> Result<PathBuf, String> {
        let (roots, uri) = (self.clone(), uri.to_owned());
        tokio::task::spawn_blocking(move || roots.resolve_uri(&uri))
            .await
            .unwrap_or_else(|_| Err("The working directory could not be checked.".to_owned()))
    }

    /// The roots, comma-separated, for messages.
    pub fn display(&self) -> String {
        self.roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
