//! Which session owns each chat, as far as this host has looked: a bounded
//! memory in front of the store (a chat's owner never changes while it
//! exists; the store is the truth, see `Engine::chat_session`).

use std::collections::HashMap;
use std::sync::Mutex;

/// Chats whose owners a host remembers: past this it forgets them all and
/// asks the store again, so what a host holds does not grow with every
/// chat it has ever seen.
const CHATS_REMEMBERED: usize = 16_384;

/// The chats' owners this host remembers, at most `cap`.
#[derive(Debug)]
pub(super) struct ChatOwners {
    owners: Mutex<HashMap<String, String>>,
    cap: usize,
}

impl Default for ChatOwners {
    fn default() -> Self {
        Self::with_cap(CHATS_REMEMBERED)
    }
}

impl ChatOwners {
    fn with_cap(cap: usize) -> Self {
        Self {
            owners: Mutex::default(),
            cap,
        }
    }

    /// The session remembered as the chat's owner.
    pub(super) fn get(&self, chat: &str) -> Option<String> {
        self.owners.lock().ok()?.get(chat).cloned()
    }

    /// Remembers a chat's owner; a new chat past the cap first forgets
    /// every other.
    pub(super) fn remember(&self, chat: &str, session: &str) {
        if let Ok(mut owners) = self.owners.lock() {
            if owners.len() >= self.cap && !owners.contains_key(chat) {
                // Its memory too, not only its entries.
                *owners = HashMap::new();
            }
            owners.insert(chat.to_owned(), session.to_owned());
        }
    }

    /// Forgets the chats of sessions that are gone.
    /// Forgets the chats of sessions that are `gone`; answers them.
    pub(super) fn forget_owned_by(&self, gone: &[String]) -> Vec<String> {
        let mut forgotten = Vec::new();
        if let Ok(mut owners) = self.owners.lock() {
            owners.retain(|chat, session| {
                let keep = !gone.contains(session);
                if !keep {
                    forgotten.push(chat.clone());
                }
                keep
            });
        }
        forgotten
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl ChatOwners {
        fn len(&self) -> usize {
            self.owners.lock().map_or(0, |o| o.len())
        }
    }

    #[test]
    fn what_is_remembered_stays_within_the_cap() {
        let owners = ChatOwners::with_cap(3);
        for n in 0..3 {
            owners.remember(&format!("chat-{n}"), "s1");
        }
        // Again: no new chat, nothing forgotten.
        owners.remember("chat-0", "s1");
        assert_eq!(owners.len(), 3);
        assert_eq!(owners.get("chat-2").as_deref(), Some("s1"));
        // A new chat past the cap: the others are forgotten, it is kept.
        owners.remember("chat-3", "s2");
        assert_eq!(owners.len(), 1);
        assert_eq!(owners.get("chat-0"), None);
        assert_eq!(owners.get("chat-3").as_deref(), Some("s2"));
        // A deleted session's chats go; others stay.
        owners.remember("chat-4", "s3");
        owners.forget_owned_by(&["s2".to_owned()]);
        assert_eq!(owners.get("chat-3"), None);
        assert_eq!(owners.get("chat-4").as_deref(), Some("s3"));
        // At the real cap, as many as it allows are kept.
        let owners = ChatOwners::default();
        for n in 0..=CHATS_REMEMBERED {
            owners.remember(&format!("chat-{n}"), "s");
        }
        assert_eq!(owners.len(), 1);
    }
}
