//! Working contexts (seed 000, velesdb's `LoadedWorkingContext`): saved per
//! (project, session), looked up with the project's other saved sessions.
//! One piece of code for every surface: REST and the host's MCP tools.

use tether_protocol::context::{
    LoadedWorkingContext, MAX_CONTEXT_BYTES, SavedWorkingContext, WorkingContext,
    WorkingContextList, WorkingContextSession,
};

use super::{Engine, EngineError, rfc3339};

/// Why a working context was not saved.
#[derive(Debug)]
pub enum SaveRefusal {
    /// It holds nothing: saving it would erase the saved one.
    Empty,
    /// Its normal form is this many bytes, over [`MAX_CONTEXT_BYTES`].
    TooLarge(usize),
    /// The store or a name.
    Engine(EngineError),
}

impl From<EngineError> for SaveRefusal {
    fn from(err: EngineError) -> Self {
        SaveRefusal::Engine(err)
    }
}

impl Engine {
    /// The lookup: whether `session` of `project` has a saved context, the
    /// context, and the project's other saved sessions, most recently saved
    /// first, never the one asked for, listed on a hit and on a miss.
    pub async fn load_working_context(
        &self,
        project: &str,
        session: &str,
    ) -> Result<LoadedWorkingContext, EngineError> {
        check_names(project, session)?;
        let store = &self.ctx.store;
        let unavailable = |e: crate::store::StoreError| EngineError::Unavailable(e.to_string());
        let saved = store
            .working_context(project, session)
            .await
            .map_err(unavailable)?;
        let working = saved
            .map(|s| serde_json::from_str::<WorkingContext>(&s.body))
            .transpose()
            .map_err(|e| {
                EngineError::Unavailable(format!("working context {project}/{session}: {e}"))
            })?;
        // The most recently saved others, a bounded few: enough to catch a
        // typo, and an answer that does not grow with the project.
        let other_sessions = store
            .working_contexts(project, None, OTHER_SESSIONS + 1)
            .await
            .map_err(unavailable)?
            .into_iter()
            .map(|c| c.session)
            .filter(|s| s != session)
            .take(OTHER_SESSIONS as usize)
            .collect();
        Ok(LoadedWorkingContext {
            found: working.is_some(),
            working,
            other_sessions,
        })
    }

    /// Saves (upserts) a context in its normal form: refused when empty (it
    /// would erase the saved one) or over [`MAX_CONTEXT_BYTES`].
    pub async fn save_working_context(
        &self,
        project: &str,
        session: &str,
        context: &WorkingContext,
    ) -> Result<SavedWorkingContext, SaveRefusal> {
        check_names(project, session)?;
        if context.is_empty() {
            return Err(SaveRefusal::Empty);
        }
        let normal = serde_json::to_string(context)
            .map_err(|e| EngineError::InvalidParams(e.to_string()))?;
        if normal.len() > MAX_CONTEXT_BYTES {
            return Err(SaveRefusal::TooLarge(normal.len()));
        }
        let saved_ms = self
            .ctx
            .store
            .save_working_context(project, session, &normal)
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        Ok(SavedWorkingContext {
            project: project.to_owned(),
            session: session.to_owned(),
            saved_at: rfc3339(saved_ms),
        })
    }

    /// A page of a project's saved contexts, most recently saved first:
    /// at most `limit`, after `cursor` (a page's `nextCursor`).
    pub async fn working_contexts(
        &self,
        project: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<WorkingContextList, EngineError> {
        tether_protocol::validate_name("project", project)
            .map_err(|e| EngineError::InvalidParams(e.to_string()))?;
        let after = cursor.map(parse_cursor).transpose()?;
        let mut saved = self
            .ctx
            .store
            .working_contexts(project, after, limit.saturating_add(1))
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        let more = saved.len() > limit as usize;
        saved.truncate(limit as usize);
        let next_cursor = more
            .then(|| {
                saved
                    .last()
                    .map(|c| format!("{}.{}", c.saved_ms, c.session))
            })
            .flatten();
        let sessions = saved
            .into_iter()
            .map(|c| WorkingContextSession {
                session: c.session,
                saved_at: rfc3339(c.saved_ms),
            })
            .collect();
        Ok(WorkingContextList {
            sessions,
            next_cursor,
        })
    }
}

/// Most other sessions a lookup lists.
pub const OTHER_SESSIONS: u32 = 100;

/// A working-context page's cursor, `<saved_ms>.<session>`, as the last
/// entry of the page before.
fn parse_cursor(cursor: &str) -> Result<(i64, &str), EngineError> {
    cursor
        .split_once('.')
        .and_then(|(ms, session)| {
            let ms = ms.parse::<i64>().ok().filter(|ms| *ms >= 0)?;
            tether_protocol::validate_name("session", session).ok()?;
            Some((ms, session))
        })
        .ok_or_else(|| {
            EngineError::InvalidParams(
                "cursor is not one this server issued; pass nextCursor back as is.".to_owned(),
            )
        })
}

fn check_names(project: &str, session: &str) -> Result<(), EngineError> {
    tether_protocol::validate_name("project", project)
        .and_then(|()| tether_protocol::validate_name("session", session))
        .map_err(|e| EngineError::InvalidParams(e.to_string()))
}
