//! Who is calling, and what it may do.
//!
//! Without an auth secret every caller is the loopback admin (the server
//! then binds to loopback only, see `config`). With one, every REST call and
//! WebSocket carries a bearer JWT ([`token`]); its claims become the
//! [`Principal`] every check runs through. [`credentials`] finds the token
//! in a request, [`limits`] bounds what one principal may take of the host.
//!
//! | role | may |
//! |---|---|
//! | viewer | read, list, subscribe, reconnect, look up working context |
//! | operator | + dispatch client-dispatchable actions, create/dispose sessions and chats, save working context, resume |
//! | agent | + host-originated actions for sessions of its projects |
//! | admin | everything, every project, `/metrics` |

pub mod credentials;
pub mod limits;
pub mod token;

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a caller was refused. The HTTP surface answers it as a problem
/// document (401 with `WWW-Authenticate`, or 403); the refusal never says
/// more than that a valid token is required.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No token, or one that is not valid (401).
    #[error("A valid bearer token is required.")]
    Unauthorized,
    /// A valid token whose role may not do this (403).
    #[error("{0}")]
    Forbidden(String),
}

/// A principal's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads sessions it may see.
    Viewer,
    /// Reads and drives sessions it may see.
    Operator,
    /// An agent acting on its sessions: an operator that may also dispatch
    /// host-originated actions.
    Agent,
    /// Everything, every project.
    Admin,
}

impl Role {
    /// The role's name as tokens and the command line spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Agent => "agent",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "viewer" => Ok(Role::Viewer),
            "operator" => Ok(Role::Operator),
            "agent" => Ok(Role::Agent),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "unknown role {other:?}: use viewer, operator, agent or admin"
            )),
        }
    }
}

/// The caller of a request or the owner of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// Who it is (the token's `sub`); logged, never the token.
    pub sub: String,
    /// What it may do.
    pub role: Role,
    /// The projects it may see; `None` means all.
    pub projects: Option<BTreeSet<String>>,
    /// When its token expires, seconds since the Unix epoch; `None` for the
    /// loopback admin.
    pub expires_at: Option<u64>,
}

impl Principal {
    /// The caller on a loopback-only host without authentication.
    pub fn loopback_admin() -> Self {
        Self {
            sub: "loopback".to_owned(),
            role: Role::Admin,
            projects: None,
            expires_at: None,
        }
    }

    /// Whether it may see a project's sessions. Sessions it may not see
    /// answer as if they did not exist.
    pub fn can_see(&self, project: &str) -> bool {
        self.role == Role::Admin || self.projects.as_ref().is_none_or(|p| p.contains(project))
    }

    /// The projects it is limited to; `None` when it sees every project.
    pub fn project_scope(&self) -> Option<Vec<String>> {
        if self.role == Role::Admin {
            return None;
        }
        self.projects
            .as_ref()
            .map(|projects| projects.iter().cloned().collect())
    }

    /// Whether it may dispatch client actions, create or dispose sessions
    /// and chats, save working context and resume: operators and above.
    pub fn can_write(&self) -> bool {
        self.role >= Role::Operator
    }

    /// Whether it may dispatch host-originated actions (an external agent's
    /// answers): agents and admins with a token. The loopback caller of a
    /// host without authentication is a plain AHP client here: AHP keeps
    /// host-originated actions the host's own.
    pub fn can_dispatch_host_actions(&self) -> bool {
        self.role >= Role::Agent && self.authenticated()
    }

    /// Whether it comes from a token (every token expires), not the
    /// loopback caller of a host without authentication.
    pub fn authenticated(&self) -> bool {
        self.expires_at.is_some()
    }

    /// The scope of its durable origins (`store::Origin::scope`): the
    /// empty scope without authentication, else its token's `sub`, so that
    /// one principal can never use up (or answer with) another's sequence
    /// numbers.
    pub fn durable_scope(&self) -> String {
        if self.authenticated() {
            format!("sub:{}", self.sub)
        } else {
            String::new()
        }
    }

    /// Whether it may read `/metrics`.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(role: Role, projects: &[&str]) -> Principal {
        Principal {
            sub: "t".into(),
            role,
            projects: Some(projects.iter().map(|p| (*p).to_owned()).collect()),
            expires_at: Some(u64::MAX),
        }
    }

    #[test]
    fn roles_nest_and_projects_bound_all_but_admins() {
        let viewer = principal(Role::Viewer, &["a"]);
        assert!(viewer.can_see("a") && !viewer.can_see("b"));
        assert!(!viewer.can_write() && !viewer.can_dispatch_host_actions());
        let operator = principal(Role::Operator, &["a"]);
        assert!(operator.can_write() && !operator.can_dispatch_host_actions());
        let agent = principal(Role::Agent, &["a"]);
        assert!(agent.can_write() && agent.can_dispatch_host_actions() && !agent.is_admin());
        let admin = principal(Role::Admin, &[]);
        assert!(admin.can_see("anything") && admin.is_admin());
        assert_eq!(admin.project_scope(), None);
        assert_eq!(viewer.project_scope(), Some(vec!["a".to_owned()]));
        assert_eq!("agent".parse::<Role>(), Ok(Role::Agent));
        assert!("root".parse::<Role>().is_err());
        let loopback = Principal::loopback_admin();
        assert!(loopback.can_write() && !loopback.can_dispatch_host_actions());
    }
}
