//! Operations on a session's changesets (`invokeChangesetOperation`):
//! `revert` writes a turn's files back as they were before it, through the
//! host's confined file access (`effects::files`), refusing every file if
//! one changed since the agent's edit; the files reverted leave the
//! changeset (`changeset/fileRemoved`, host-originated).

use std::path::PathBuf;

use ahp_types::state::{ChangesetFile, FileEditSide};
use serde_json::{Value, json};
use tether_protocol::workdir::file_uri_path;

use super::{DispatchOutcome, SessionActor};
use crate::agents::acp::edits::REVERT;
use crate::effects::files::SessionFiles;
use crate::engine::EngineError;
use crate::store::attachment_digest;

/// One file to put back: where, what it must still be, what it was.
struct Putback {
    id: String,
    path: PathBuf,
    after: Option<Vec<u8>>,
    before: Option<Vec<u8>>,
}

impl SessionActor {
    /// Reverts `changeset` (every file, or the one `resource` names).
    pub(super) async fn revert(
        &mut self,
        changeset: &str,
        resource: Option<&str>,
    ) -> Result<Value, EngineError> {
        let invalid = |m: String| EngineError::InvalidParams(m);
        let model = self
            .model
            .as_ref()
            .ok_or_else(|| EngineError::NotFound(format!("Session {} does not exist.", self.id)))?;
        let state = model
            .changesets
            .get(changeset)
            .ok_or_else(|| invalid(format!("Changeset {changeset} has no files to revert.")))?;
        let offered = state.operations.iter().flatten().any(|o| o.id == REVERT);
        if !offered {
            return Err(invalid(format!(
                "Changeset {changeset} does not offer {REVERT:?}."
            )));
        }
        let files: Vec<&ChangesetFile> = match resource {
            None => state.files.iter().collect(),
            Some(uri) => {
                let file =
                    state.files.iter().find(|f| f.id == uri).ok_or_else(|| {
                        invalid(format!("{uri} is not in changeset {changeset}."))
                    })?;
                vec![file]
            }
        };
        if files.is_empty() {
            return Ok(json!({"message": "Nothing to revert."}));
        }
        let mut putbacks = Vec::new();
        for file in files {
            let path = file_uri_path(&file.id)
                .map(PathBuf::from)
                .map_err(|e| invalid(format!("{}: {e}", file.id)))?;
            putbacks.push(Putback {
                id: file.id.clone(),
                path,
                after: self.side_bytes(file.edit.after.as_ref()).await?,
                before: self.side_bytes(file.edit.before.as_ref()).await?,
            });
        }
        let dirs: Vec<PathBuf> = model
            .session
            .working_directories
            .iter()
            .flatten()
            .filter_map(|uri| {
                self.ctx
                    .config
                    .roots
                    .resolve_uri(&model.created.project, uri)
                    .ok()
            })
            .collect();
        let reverted = tokio::task::spawn_blocking(move || {
            let files = SessionFiles::new(&dirs);
            // Every file first: one changed since refuses them all.
            let changed: Vec<String> = putbacks
                .iter()
                .filter_map(|p| files.check_unchanged(&p.path, p.after.as_deref()).err())
                .collect();
            if !changed.is_empty() {
                return Err(changed.join(" "));
            }
            let mut done = Vec::new();
            for p in &putbacks {
                files.revert(&p.path, p.after.as_deref(), p.before.as_deref())?;
                done.push(p.id.clone());
            }
            Ok(done)
        })
        .await
        .map_err(|_| EngineError::Unavailable("the revert was interrupted".into()))?
        .map_err(|reason| EngineError::Conflict(format!("Nothing was reverted: {reason}")))?;
        for id in &reverted {
            self.follow_ups.push((
                changeset.to_owned(),
                json!({"type": "changeset/fileRemoved", "fileId": id}),
            ));
        }
        for outcome in self.run_follow_ups().await {
            if let DispatchOutcome::Rejected(refusal) = outcome {
                tracing::warn!(session = %self.id, reason = %refusal.reason, "a reverted file stays listed");
            }
        }
        let count = reverted.len();
        Ok(
            json!({"message": format!("Reverted {count} file{}.", if count == 1 { "" } else { "s" })}),
        )
    }

    /// The bytes one side of an edit refers to (`None`: no such side).
    async fn side_bytes(
        &self,
        side: Option<&FileEditSide>,
    ) -> Result<Option<Vec<u8>>, EngineError> {
        let Some(side) = side else {
            return Ok(None);
        };
        let digest = attachment_digest(&side.content.uri).ok_or_else(|| {
            EngineError::InvalidParams(format!(
                "{} is not kept by this host; it cannot be reverted.",
                side.uri
            ))
        })?;
        let stored = self
            .ctx
            .store
            .attachment(&self.id, digest)
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string()))?
            .ok_or_else(|| {
                EngineError::Unavailable(format!("The text of {} is no longer kept.", side.uri))
            })?;
        Ok(Some(stored.data))
    }
}
