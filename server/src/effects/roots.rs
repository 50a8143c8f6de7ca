//! The allowed roots (`--allowed-roots`): where working directories may
//! be. One rule for every side-effect backend and for agent starts: a
//! directory is resolved (symlinks followed) and must exist, be a
//! directory and lie inside a root its session's project may use. With no
//! roots set, only the `local` backend asks that it exist.
//!
//! A root is open to every project (`/srv/work`) or one project's
//! (`alpha=/srv/alpha`). The root nearest a directory decides: a project's
//! root inside an open one is that project's alone, so another project's
//! session cannot name it (nor anything under it) and have its agent read
//! and write there.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tether_protocol::workdir::file_uri_path;

/// One allowed root: its directory, resolved, and the project it is kept
/// for (`None`: open to every project).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    pub project: Option<String>,
    pub path: PathBuf,
}

impl Root {
    /// `PROJECT=PATH` or `PATH`. A word before `=` is a project only when
    /// it is a valid project name (so a path holding `=` is a path).
    pub fn parse(text: &Path) -> Self {
        let kept = text.to_str().and_then(|text| {
            let (project, path) = text.split_once('=')?;
            tether_protocol::validate_name("project", project).ok()?;
            Some((project.to_owned(), PathBuf::from(path)))
        });
        let (project, path) = match kept {
            Some((project, path)) => (Some(project), path),
            None => (None, text.to_path_buf()),
        };
        Self {
            project,
            path: resolved(&path),
        }
    }
}

impl std::fmt::Display for Root {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.project {
            Some(project) => write!(f, "{project}={}", self.path.display()),
            None => write!(f, "{}", self.path.display()),
        }
    }
}

/// `path` with its symlinks resolved; one that does not exist (yet) is
/// resolved as far as it does, the rest kept as written (a project's root
/// made later is still its own).
fn resolved(path: &Path) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => resolved(parent).join(name),
        _ => lexical(path),
    }
}

/// `path` with `.` and `..` folded away, without touching the disk.
fn lexical(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Why a directory may not be used, and the message that says so.
enum Refused {
    /// Inside another project's root.
    Kept(String),
    /// Inside no root.
    Outside(String),
}

/// The allowed roots, resolved, and what no session may use whatever
/// they are; cheap to clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roots {
    roots: Arc<[Root]>,
    /// The agents' scratch root: every session's agent HOME (its logins,
    /// histories, caches) is in it, so no session may work in it, nor in a
    /// directory holding it.
    scratch: Option<PathBuf>,
}

impl Roots {
    /// Roots from the command line's words (see [`Root::parse`]), resolved
    /// now.
    pub fn new(roots: &[PathBuf]) -> Self {
        Self {
            roots: roots.iter().map(|root| Root::parse(root)).collect(),
            scratch: None,
        }
    }

    /// These roots, keeping every session out of the agents' scratch root
    /// `scratch` (resolved now, as far as it exists).
    pub fn keeping_out(self, scratch: &Path) -> Self {
        Self {
            scratch: Some(resolved(scratch)),
            ..self
        }
    }

    /// Whether no roots are set (any directory may be used).
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// The roots, resolved.
    pub fn list(&self) -> &[Root] {
        &self.roots
    }

    /// A working directory's `file:` URI resolved for a session of
    /// `project`: it must exist and be a directory, and lie inside a root
    /// that project may use when roots are set.
    pub fn resolve_uri(&self, project: &str, uri: &str) -> Result<PathBuf, String> {
        let path = file_uri_path(uri).map_err(|e| e.to_string())?;
        self.resolve(project, Path::new(&path))
    }

    /// A working directory resolved (see [`Roots::resolve_uri`]).
    pub fn resolve(&self, project: &str, path: &Path) -> Result<PathBuf, String> {
        let shown = path.display();
        // As written first, before the disk is asked: whether something
        // exists inside another project's root is not told. (Only that
        // refusal: a path written through a symlink may lie outside the
        // roots as written and inside them resolved.)
        match self.check(project, &lexical(path), path) {
            Err(Refused::Kept(reason)) => return Err(reason),
            Err(Refused::Outside(_)) | Ok(()) => {}
        }
        let resolved = std::fs::canonicalize(path)
            .map_err(|_| format!("Working directory {shown} does not exist on this host."))?;
        let metadata = std::fs::metadata(&resolved)
            .map_err(|e| format!("Working directory {shown} cannot be read: {e}."))?;
        if !metadata.is_dir() {
            return Err(format!("Working directory {shown} is not a directory."));
        }
        // Resolved: a symlink does not lead elsewhere.
        match self.check(project, &resolved, path) {
            Err(Refused::Kept(reason) | Refused::Outside(reason)) => Err(reason),
            Ok(()) => Ok(resolved),
        }
    }

    /// Whether `project` may use `path` (`shown` as the caller wrote it):
    /// the nearest roots holding it decide (one of them open, or the
    /// project's own).
    fn check(&self, project: &str, path: &Path, shown: &Path) -> Result<(), Refused> {
        self.kept_out(path, shown).map_err(Refused::Kept)?;
        if self.roots.is_empty() {
            return Ok(());
        }
        let holding = || {
            self.roots
                .iter()
                .filter(|root| path.starts_with(&root.path))
        };
        let Some(depth) = holding().map(|root| root.path.components().count()).max() else {
            return Err(Refused::Outside(format!(
                "Working directory {} is outside the allowed roots ({}); ask the operator to \
                 add it to TETHER_ALLOWED_ROOTS.",
                shown.display(),
                self.display_for(project)
            )));
        };
        if holding()
            .filter(|root| root.path.components().count() == depth)
            .any(|root| root.project.as_deref().is_none_or(|p| p == project))
        {
            return Ok(());
        }
        Err(Refused::Kept(format!(
            "Working directory {} is kept for another project; sessions of project {project} \
             may use {}.",
            shown.display(),
            self.display_for(project)
        )))
    }

    /// Refuses `path` (`shown` as the caller wrote it) when it is the
    /// agents' scratch root, inside it or holding it.
    fn kept_out(&self, path: &Path, shown: &Path) -> Result<(), String> {
        match &self.scratch {
            Some(scratch) if path.starts_with(scratch) || scratch.starts_with(path) => {
                Err(format!(
                    "Working directory {} is, lies inside or holds the agents' scratch \
                 directories (each session's agent HOME, with its logins); no session may work \
                 there: choose another working directory.",
                    shown.display()
                ))
            }
            _ => Ok(()),
        }
    }

    /// Whether a session of `project` may be given `uri`, off the async
    /// threads (it touches the disk): with roots set, as
    /// [`Roots::resolve_uri`] says; without, only the scratch root is kept
    /// out (a directory this host does not have is the side-effect
    /// backend's to judge).
    pub async fn check_uri(&self, project: &str, uri: &str) -> Result<(), String> {
        let (roots, project, uri) = (self.clone(), project.to_owned(), uri.to_owned());
        tokio::task::spawn_blocking(move || {
            if !roots.is_empty() {
                return roots.resolve_uri(&project, &uri).map(|_| ());
            }
            let path = file_uri_path(&uri).map_err(|e| e.to_string())?;
            let path = Path::new(&path);
            roots.kept_out(&lexical(path), path)?;
            match std::fs::canonicalize(path) {
                Ok(real) => roots.kept_out(&real, path),
                Err(_) => Ok(()),
            }
        })
        .await
        .unwrap_or_else(|_| Err("The working directory could not be checked.".to_owned()))
    }

    /// The roots `project` may use, comma-separated, for messages (another
    /// project's roots are not named to it).
    pub fn display_for(&self, project: &str) -> String {
        let shown: Vec<String> = self
            .roots
            .iter()
            .filter(|root| root.project.as_deref().is_none_or(|p| p == project))
            .map(|root| root.path.display().to_string())
            .collect();
        if shown.is_empty() {
            "none".to_owned()
        } else {
            shown.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> (tempfile::TempDir, PathBuf) {
        let top = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(top.path()).unwrap();
        for dir in ["open/alpha/x", "open/beta/y", "open/shared", "elsewhere"] {
            std::fs::create_dir_all(base.join(dir)).unwrap();
        }
        (top, base)
    }

    #[test]
    fn the_nearest_root_decides_which_project_may_use_a_directory() {
        let (_top, base) = dirs();
        let roots = Roots::new(&[
            base.join("open"),
            PathBuf::from(format!("alpha={}", base.join("open/alpha").display())),
            PathBuf::from(format!("beta={}", base.join("open/beta").display())),
        ]);
        assert_eq!(roots.list()[1].project.as_deref(), Some("alpha"));
        // Each project its own and the open root's.
        assert!(roots.resolve("alpha", &base.join("open/alpha/x")).is_ok());
        assert!(roots.resolve("alpha", &base.join("open/shared")).is_ok());
        assert!(roots.resolve("gamma", &base.join("open/shared")).is_ok());
        // Never another's, by its own path or a parent's.
        let refused = roots
            .resolve("alpha", &base.join("open/beta/y"))
            .unwrap_err();
        assert!(refused.contains("another project"), "{refused}");
        let offered = refused.split("may use").nth(1).unwrap();
        assert!(!offered.contains("beta"), "offers beta's root: {refused}");
        assert!(roots.resolve("gamma", &base.join("open/alpha")).is_err());
        // Nothing outside the roots.
        let outside = roots.resolve("alpha", &base.join("elsewhere")).unwrap_err();
        assert!(outside.contains("outside the allowed roots"), "{outside}");
    }

    #[test]
    fn a_symlink_into_another_projects_root_is_refused() {
        let (_top, base) = dirs();
        std::os::unix::fs::symlink(base.join("open/beta"), base.join("open/shared/link")).unwrap();
        let roots = Roots::new(&[
            base.join("open"),
            PathBuf::from(format!("beta={}", base.join("open/beta").display())),
        ]);
        assert!(
            roots
                .resolve("alpha", &base.join("open/shared/link"))
                .is_err()
        );
        assert!(
            roots
                .resolve("beta", &base.join("open/shared/link"))
                .is_ok()
        );
    }

    /// Nothing is told of what exists inside another project's root, even
    /// through `..`; a project's root made after the server started is
    /// still its own.
    #[test]
    fn another_projects_root_says_nothing_of_what_is_in_it() {
        let (_top, base) = dirs();
        let roots = Roots::new(&[
            base.join("open"),
            PathBuf::from(format!("beta={}", base.join("open/beta").display())),
            PathBuf::from(format!("gamma={}", base.join("open/gamma").display())),
        ]);
        let there = roots
            .resolve("alpha", &base.join("open/beta/y"))
            .unwrap_err();
        let absent = roots
            .resolve("alpha", &base.join("open/shared/../beta/nothing"))
            .unwrap_err();
        assert!(there.contains("another project"), "{there}");
        assert!(absent.contains("another project"), "{absent}");
        std::fs::create_dir_all(base.join("open/gamma")).unwrap();
        assert!(roots.resolve("alpha", &base.join("open/gamma")).is_err());
        assert!(roots.resolve("gamma", &base.join("open/gamma")).is_ok());
    }

    #[test]
    fn a_path_with_an_equals_sign_is_a_path() {
        let root = Root::parse(Path::new("/srv/a=b/c"));
        assert_eq!(root.project, None);
        assert_eq!(root.path, PathBuf::from("/srv/a=b/c"));
    }
}
