//! Who is calling. Until token authentication lands, every caller is the
//! loopback admin, but every check already runs through [`Principal`].

use std::collections::BTreeSet;

/// A principal's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Reads sessions it may see.
    Viewer,
    /// Reads and drives sessions it may see.
    Operator,
    /// An agent acting on its sessions.
    Agent,
    /// Everything.
    Admin,
}

/// The caller of a request or the owner of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// What it may do.
    pub role: Role,
    /// The projects it may see; `None` means all.
    pub projects: Option<BTreeSet<String>>,
}

impl Principal {
    /// The caller on a loopback-only host without authentication.
    pub fn loopback_admin() -> Self {
        Self {
            role: Role::Admin,
            projects: None,
        }
    }

    /// Whether it may see a project's sessions. Sessions it may not see
    /// answer as if they did not exist.
    pub fn can_see(&self, project: &str) -> bool {
        self.projects.as_ref().is_none_or(|p| p.contains(project))
    }

    /// Whether it may dispatch actions and create or dispose sessions.
    pub fn can_write(&self) -> bool {
        self.role != Role::Viewer
    }
}
