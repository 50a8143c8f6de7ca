//! Folding a session from its stored transcript: how a session actor
//! rebuilds its state (from the latest snapshot plus the tail), and how
//! `tether rebuild-projections` re-derives every read-model row from the
//! whole transcript (invariant 5: the read model is a fold of the log).

use std::borrow::Cow;

use serde_json::Value;
use tether_protocol::channel::Channel;
use tether_protocol::model::{SessionModel, typed_action};
use tether_protocol::view::SessionViewRef;

use crate::store::{SessionFilter, SessionRecord, Store, StoreError, StoredEnvelope};

/// How many transcript rows one read takes.
const PAGE: u32 = 2_000;

/// Folds a session's transcript into its model: from the latest snapshot
/// (when `from_snapshot`) or from the first record. `None` when the session
/// has no records.
pub async fn load_model(
    store: &dyn Store,
    id: &str,
    from_snapshot: bool,
) -> Result<Option<SessionModel>, String> {
    let uri = Channel::session_uri(id);
    let mut model: Option<SessionModel> = None;
    if from_snapshot
        && let Some(snapshot) = store
            .latest_snapshot(&uri)
            .await
            .map_err(|e| e.to_string())?
    {
        model = Some(
            serde_json::from_str(&snapshot.state)
                .map_err(|e| format!("snapshot of {uri} is unreadable: {e}"))?,
        );
    }
    fold_tail(store, id, model).await
}

/// Folds the session's envelopes after `model` (all of them when `None`)
/// into it.
pub async fn fold_tail(
    store: &dyn Store,
    id: &str,
    model: Option<SessionModel>,
) -> Result<Option<SessionModel>, String> {
    fold_each(store, id, model, |_, _, _| {}).await
}

/// [`fold_tail`], calling `each` with the model after each envelope was
/// folded in, the envelope and its action.
pub async fn fold_each(
    store: &dyn Store,
    id: &str,
    mut model: Option<SessionModel>,
    mut each: impl FnMut(&SessionModel, &StoredEnvelope, &Value),
) -> Result<Option<SessionModel>, String> {
    let mut after = model.as_ref().map_or(0, |m| m.last_seq);
    loop {
        let page = store
            .transcript(id, after, PAGE)
            .await
            .map_err(|e| e.to_string())?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        for envelope in page {
            let action: Value = serde_json::from_str(&envelope.action)
                .map_err(|e| format!("envelope {} is unreadable: {e}", envelope.seq))?;
            // None yet, or the session was deleted (retention) and made
            // again with its id since `model` was folded (a copy on another
            // host): the log begins anew there.
            let first = tether_protocol::actions::action_type(&action)
                == Some(tether_protocol::actions::SESSION_CREATED);
            match &mut model {
                Some(m) if !first => {
                    m.apply(&envelope.channel, &action, &typed_action(&action));
                    m.last_seq = envelope.seq;
                }
                _ => {
                    model = Some(
                        SessionModel::from_first_record(id, &action, envelope.seq)
                            .map_err(|e| e.to_string())?,
                    );
                }
            }
            if let Some(m) = &model {
                each(m, &envelope, &action);
            }
        }
    }
    Ok(model)
}

/// The read-model row of a model. `live` says whether its agent is attached.
///
/// Written on every commit: the view is serialised from the model where
/// it stands, nothing copied first, into a buffer sized for most views.
pub fn record_of(model: &SessionModel, live: bool, updated_at: &str) -> SessionRecord {
    let view = SessionViewRef::of(model, live, updated_at);
    let mut projection = Vec::with_capacity(PROJECTION_BYTES);
    // A view is strings, numbers and maps with string keys: it cannot fail
    // to serialise, and serde_json writes UTF-8.
    let projection = match serde_json::to_writer(&mut projection, &view) {
        Ok(()) => String::from_utf8(projection).unwrap_or_default(),
        Err(_) => String::new(),
    };
    SessionRecord {
        id: model.id.clone(),
        project: view.project.to_owned(),
        provider: view.provider.to_owned(),
        title: view.title.map(Cow::into_owned),
        state: view.state.as_str().to_owned(),
        turns: view.turns,
        resumable: view.resumable,
        created_ms: super::parse_ms(&model.created.created_at),
        projection,
    }
}

/// Room for a session's serialised view: a new session's with a title is
/// about 520 bytes, one with an agent's commands and plan a few KiB (a
/// `String` grown from empty copied a 520-byte view three times).
const PROJECTION_BYTES: usize = 1024;

/// What a rebuild did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Sessions folded.
    pub sessions: usize,
    /// Rows whose stored value differed from the fold and were rewritten.
    pub changed: usize,
}

/// Re-folds every session's whole transcript and rewrites the read-model
/// rows that differ. Run it with the server stopped: no agent is attached
/// then, so every state comes from the settling records.
pub async fn rebuild_projections(store: &dyn Store) -> Result<RebuildReport, StoreError> {
    let mut report = RebuildReport::default();
    let mut before = None;
    loop {
        let page = store
            .sessions(&SessionFilter::default(), before, 500)
            .await?;
        for row in &page.items {
            let Some(model) = load_model(store, &row.record.id, false)
                .await
                .map_err(StoreError::Corrupt)?
            else {
                continue;
            };
            report.sessions += 1;
            let fresh = record_of(&model, false, &super::rfc3339(row.updated_ms));
            if !same_record(&fresh, &row.record) {
                store.replace_session_record(&fresh).await?;
                report.changed += 1;
            }
        }
        match page.next_before {
            Some(next) => before = Some(next),
            None => break,
        }
    }
    Ok(report)
}

/// Compares rows by value: the stored view as JSON, without `lastSeq` and
/// `updatedAt`, which readers take from the row's own columns.
fn same_record(a: &SessionRecord, b: &SessionRecord) -> bool {
    let json = |t: &str| {
        let mut view = serde_json::from_str::<Value>(t).ok()?;
        if let Some(map) = view.as_object_mut() {
            map.remove("lastSeq");
            map.remove("updatedAt");
        }
        Some(view)
    };
    a.id == b.id
        && a.project == b.project
        && a.provider == b.provider
        && a.title == b.title
        && a.state == b.state
        && a.turns == b.turns
        && a.resumable == b.resumable
        && json(&a.projection) == json(&b.projection)
}
