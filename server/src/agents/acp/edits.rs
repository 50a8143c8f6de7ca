//! An agent's file edits as AHP has them: each ACP `Diff` (or write
//! through `fs/write_text_file`) is a `FileEdit` with both sides stored
//! once, by reference (`tether-attachment:` URIs, as attachments are), and
//! line counts; the edits of one turn are that turn's changeset
//! (`ahp-changeset:/<session>/<turnId>`), which clients can revert file by
//! file or whole (`invokeChangesetOperation`, served by the engine).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use tether_protocol::channel::Channel;

use super::map::{Actions, Turn};
use crate::store::Attachment;

/// The operation a turn's changeset offers: writing every file's old text
/// back (a created file is removed), refused for a file changed since.
pub const REVERT: &str = "revert";

/// The changeset operations Tether offers.
pub fn operations() -> Value {
    json!([{
        "id": REVERT, "label": "Revert",
        "description": "Write the files' text from before the turn back (a file the turn \
            created is removed); a file changed since is left alone.",
        "scopes": ["changeset", "resource"],
        "confirmation": "Revert these changes? Files changed since are not touched.",
        "icon": "discard", "status": "idle",
    }])
}

/// One file's change over a turn: its text before the turn's first edit
/// and after its latest.
#[derive(Debug, Clone)]
struct Change {
    before: Option<String>,
    after: Option<String>,
}

/// The edits of the current turn, and what has been told already.
#[derive(Debug, Default)]
pub struct TurnEdits {
    /// By file URI.
    files: BTreeMap<String, Change>,
    /// Whether the session's changeset catalogue was recorded by this
    /// process.
    catalogued: bool,
}

/// One edit, mapped: the tool call's `fileEdit` content, the changeset's
/// actions, and the texts to store before they are recorded.
#[derive(Debug, Default)]
pub struct Edit {
    /// AHP `ToolResultFileEditContent`.
    pub content: Value,
    /// The changeset's actions (and the catalogue's, the first time).
    pub actions: Actions,
    /// The texts of both sides.
    pub stored: Vec<Attachment>,
}

impl TurnEdits {
    /// A new turn: its changeset starts empty.
    pub fn begin(&mut self) {
        self.files.clear();
    }

    /// `path` went from `old` (`None`: it did not exist) to `new` in
    /// `turn` of session `session_id`.
    pub fn edit(
        &mut self,
        session_id: &str,
        turn: Option<&Turn>,
        path: &Path,
        old: Option<&str>,
        new: Option<&str>,
    ) -> Edit {
        let uri = file_uri(path);
        let mut stored = Vec::new();
        let content = file_edit(session_id, &uri, old, new, &mut stored);
        let mut actions = Vec::new();
        if let Some(turn) = turn {
            let changeset = Channel::changeset_uri(session_id, &turn.turn_id);
            if !self.catalogued {
                self.catalogued = true;
                actions.push((
                    Channel::session_uri(session_id),
                    json!({"type": "session/changesetsChanged", "changesets": [{
                        "label": "Changes of a turn",
                        "uriTemplate": Channel::turn_changesets_template(session_id),
                        "description": "The files an agent changed in one turn, both sides.",
                        "changeKind": "turn"}]}),
                ));
            }
            if self.files.is_empty() {
                actions.push((
                    changeset.clone(),
                    json!({"type": "changeset/operationsChanged", "operations": operations()}),
                ));
            }
            let change = self.files.entry(uri.clone()).or_insert_with(|| Change {
                before: old.map(str::to_owned),
                after: None,
            });
            change.after = new.map(str::to_owned);
            if change.before == change.after {
                // Back to where the turn found it: nothing changed.
                actions.push((
                    changeset,
                    json!({"type": "changeset/fileRemoved", "fileId": uri}),
                ));
            } else {
                let (before, after) = (change.before.clone(), change.after.clone());
                let edit = file_edit(
                    session_id,
                    &uri,
                    before.as_deref(),
                    after.as_deref(),
                    &mut stored,
                );
                actions.push((
                    changeset,
                    json!({"type": "changeset/fileSet", "file": {"id": uri, "edit": edit}}),
                ));
            }
        }
        stored.sort_by(|a, b| a.digest.cmp(&b.digest));
        stored.dedup_by(|a, b| a.digest == b.digest);
        Edit {
            content,
            actions,
            stored,
        }
    }
}

/// An edit not yet made (a tool call's proposal, shown before it is
/// confirmed) as an AHP `FileEdit`, and the sides to store.
pub fn preview(
    session_id: &str,
    path: &Path,
    old: Option<&str>,
    new: &str,
) -> (Value, Vec<Attachment>) {
    let mut stored = Vec::new();
    let mut edit = file_edit(session_id, &file_uri(path), old, Some(new), &mut stored);
    if let Some(edit) = edit.as_object_mut() {
        // A `FileEdit`, not tool result content.
        edit.remove("type");
    }
    (edit, stored)
}

/// A path as a `file:` URI (percent-encoding what a URI cannot hold).
pub fn file_uri(path: &Path) -> String {
    let mut uri = String::from("file://");
    for byte in path.to_string_lossy().bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                uri.push(byte as char)
            }
            other => uri.push_str(&format!("%{other:02X}")),
        }
    }
    uri
}

/// An AHP `FileEdit` of `uri` from `old` to `new`, each side's text stored.
fn file_edit(
    session_id: &str,
    uri: &str,
    old: Option<&str>,
    new: Option<&str>,
    stored: &mut Vec<Attachment>,
) -> Value {
    let mut side = |text: &str| {
        let attachment = Attachment::new(session_id, "text/plain", text.as_bytes().to_vec());
        let content = json!({"uri": attachment.uri(), "contentType": "text/plain",
                             "sizeHint": text.len()});
        stored.push(attachment);
        json!({"uri": uri, "content": content})
    };
    let (added, removed) = line_counts(old.unwrap_or_default(), new.unwrap_or_default());
    let mut edit = json!({"type": "fileEdit", "diff": {"added": added, "removed": removed}});
    if let Some(old) = old {
        edit["before"] = side(old);
    }
    if let Some(new) = new {
        edit["after"] = side(new);
    }
    edit
}

/// Lines added and removed from `old` to `new`.
pub fn line_counts(old: &str, new: &str) -> (usize, usize) {
    let diff = similar::TextDiff::configure()
        .timeout(std::time::Duration::from_millis(200))
        .diff_lines(old, new);
    diff.ops()
        .iter()
        .fold((0, 0), |(added, removed), op| match op.tag() {
            similar::DiffTag::Insert => (added + op.new_range().len(), removed),
            similar::DiffTag::Delete => (added, removed + op.old_range().len()),
            similar::DiffTag::Replace => {
                (added + op.new_range().len(), removed + op.old_range().len())
            }
            similar::DiffTag::Equal => (added, removed),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn() -> Turn {
        Turn {
            chat: "ahp-chat:/s.main".into(),
            turn_id: "t1".into(),
        }
    }

    #[test]
    fn counts_lines_added_and_removed() {
        assert_eq!(line_counts("a\nb\nc\n", "a\nB\nc\nd\n"), (2, 1));
        assert_eq!(line_counts("", "x\n"), (1, 0));
        assert_eq!(line_counts("same\n", "same\n"), (0, 0));
    }

    #[test]
    fn a_turns_edits_are_one_changeset_from_the_first_text_to_the_last() {
        let mut edits = TurnEdits::default();
        let path = Path::new("/w/a b.rs");
        let first = edits.edit("s", Some(&turn()), path, Some("one\n"), Some("two\n"));
        assert_eq!(first.content["before"]["uri"], "file:///w/a%20b.rs");
        assert_eq!(first.content["diff"], json!({"added": 1, "removed": 1}));
        let kinds: Vec<&str> = first
            .actions
            .iter()
            .map(|(_, a)| a["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "session/changesetsChanged",
                "changeset/operationsChanged",
                "changeset/fileSet"
            ]
        );
        assert_eq!(first.actions[2].0, "ahp-changeset:/s/t1");
        assert_eq!(first.stored.len(), 2);
        // A second edit of the same file: the changeset spans both.
        let second = edits.edit("s", Some(&turn()), path, Some("two\n"), Some("three\n"));
        assert_eq!(second.actions.len(), 1);
        let file = &second.actions[0].1["file"];
        let before = Attachment::new("s", "text/plain", b"one\n".to_vec()).uri();
        assert_eq!(file["edit"]["before"]["content"]["uri"], before);
        // Back to the first text: the file leaves the changeset.
        let back = edits.edit("s", Some(&turn()), path, Some("three\n"), Some("one\n"));
        assert_eq!(back.actions[0].1["type"], "changeset/fileRemoved");
        // A created file has no before side.
        let created = edits.edit("s", Some(&turn()), Path::new("/w/new"), None, Some("x"));
        assert!(created.content.get("before").is_none());
        assert_eq!(created.content["after"]["content"]["sizeHint"], 1);
    }
}
