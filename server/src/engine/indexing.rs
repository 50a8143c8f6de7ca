//! Indexing transcripts written before the search index existed: the
//! migration that made the index lists every session then known as
//! pending, and each host, once started, folds each pending session's
//! transcript to write its documents (DESIGN.md, "Finding, notifying,
//! keeping"). What is appended from then on is indexed in its own
//! transaction; a document the fold computes never replaces one a later
//! envelope wrote, so the two can run side by side, on several hosts too.

use std::collections::HashMap;
use std::sync::Arc;

use tether_protocol::search::{self, SearchDoc};

use super::rebuild::fold_each;
use crate::store::Store;

/// Sessions taken per round.
const ROUND: u32 = 100;

/// Documents written per transaction.
const CHUNK: usize = 500;

/// Indexes every pending session in the background, then stops.
pub(super) fn start(store: Arc<dyn Store>) {
    tokio::spawn(async move {
        let mut indexed = 0_u64;
        loop {
            let pending = match store.search_pending(ROUND).await {
                Ok(pending) => pending,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot list sessions to index; will retry");
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                    continue;
                }
            };
            if pending.is_empty() {
                break;
            }
            for id in pending {
                match index_session(store.as_ref(), &id).await {
                    Ok(_) => indexed += 1,
                    Err(err) => {
                        // Left pending: the next start tries again.
                        tracing::warn!(session = %id, error = %err, "cannot index session");
                        return;
                    }
                }
            }
        }
        if indexed > 0 {
            tracing::info!(
                sessions = indexed,
                "search index built for existing sessions"
            );
            // Written in bulk: the planner's statistics would lag behind.
            if let Err(err) = store.analyze().await {
                tracing::warn!(error = %err, "cannot refresh the planner's statistics");
            }
        }
    });
}

/// Writes the search documents of one session's whole transcript and
/// marks it indexed; returns how many documents it wrote.
pub async fn index_session(store: &dyn Store, id: &str) -> Result<usize, String> {
    let mut docs: HashMap<String, (u64, i64, SearchDoc)> = HashMap::new();
    fold_each(store, id, None, |model, envelope, action| {
        for doc in search::doc(model, &envelope.channel, action) {
            docs.insert(doc.key.clone(), (envelope.seq, envelope.at_ms, doc));
        }
    })
    .await?;
    let mut docs: Vec<_> = docs.into_values().collect();
    docs.sort_by_key(|(seq, _, _)| *seq);
    for chunk in docs.chunks(CHUNK) {
        store
            .put_search_docs(id, chunk)
            .await
            .map_err(|e| e.to_string())?;
    }
    store.search_indexed(id).await.map_err(|e| e.to_string())?;
    Ok(docs.len())
}
