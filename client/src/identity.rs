//! Who a client is to the server: its `clientId` and the `clientSeq` numbers
//! it has used.
//!
//! Tether applies each `(clientId, clientSeq)` at most once, which makes a
//! retry safe — and makes reusing a number for a *different* action an error.
//! A client that keeps its id across runs must therefore never hand out the
//! same `clientSeq` twice. [`ClientIdentity::persistent`] keeps the counter in
//! a small file: numbers are reserved in blocks (one write per block, under a
//! file lock, so several processes sharing one identity never collide), and a
//! crash loses at most the rest of a block, never reuses one.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::Error;

/// How many `clientSeq` numbers one write of the identity file reserves.
const BLOCK: u64 = 64;

/// A client's id and its `clientSeq` allocator.
#[derive(Debug)]
pub struct ClientIdentity {
    client_id: String,
    file: Option<PathBuf>,
    seqs: Mutex<Seqs>,
}

/// Numbers `next..=reserved` may be handed out without touching the file.
#[derive(Debug)]
struct Seqs {
    next: u64,
    reserved: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Saved {
    client_id: String,
    /// Every number up to this one has been handed out (or reserved).
    reserved_up_to: u64,
}

impl ClientIdentity {
    /// A fresh random id that lives as long as this value: numbering starts
    /// at 1 and nothing is saved.
    pub fn ephemeral() -> Self {
        Self::in_memory(format!("tether-client-{}", uuid::Uuid::new_v4()))
    }

    /// A caller-chosen id numbered from 1 in memory. Only safe when the id
    /// is new to the server (or the caller keeps numbers unique itself).
    pub fn in_memory(client_id: impl Into<String>) -> Self {
        Self {
            client_id: client_id.into(),
            file: None,
            seqs: Mutex::new(Seqs {
                next: 1,
                reserved: u64::MAX,
            }),
        }
    }

    /// The identity kept in `path`, created (with a random id) when the file
    /// does not exist yet. Numbers continue after every number any earlier
    /// run reserved.
    pub fn persistent(path: impl Into<PathBuf>) -> Result<Self, Error> {
        let path = path.into();
        let client_id = with_locked(&path, |saved| saved.client_id.clone())?;
        Ok(Self {
            client_id,
            file: Some(path),
            seqs: Mutex::new(Seqs {
                next: 1,
                reserved: 0,
            }),
        })
    }

    /// The `clientId` to announce in `initialize` and `reconnect`.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The file the counter is kept in, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// A `clientSeq` this identity has never handed out before.
    pub fn next_seq(&self) -> Result<u64, Error> {
        let mut seqs = self
            .seqs
            .lock()
            .map_err(|_| identity_error(self.file.as_deref(), "the counter lock is poisoned"))?;
        if seqs.next > seqs.reserved {
            let path = self
                .file
                .as_deref()
                .ok_or_else(|| identity_error(None, "clientSeq numbers are exhausted"))?;
            let first = with_locked(path, |saved| {
                let first = saved.reserved_up_to + 1;
                saved.reserved_up_to += BLOCK;
                first
            })?;
            seqs.next = first;
            seqs.reserved = first + BLOCK - 1;
        }
        let seq = seqs.next;
        seqs.next += 1;
        Ok(seq)
    }
}

/// Runs `change` on the identity saved at `path` (creating it first if
/// needed) while holding an exclusive lock, and saves what it leaves.
fn with_locked<T>(path: &Path, change: impl FnOnce(&mut Saved) -> T) -> Result<T, Error> {
    let fail =
        |what: &str, err: std::io::Error| identity_error(Some(path), &format!("{what}: {err}"));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| fail("cannot create its directory", e))?;
    }
    let lock_path = sibling(path, "lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| fail("cannot open its lock file", e))?;
    lock.lock().map_err(|e| fail("cannot lock it", e))?;
    let mut saved = match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice::<Saved>(&bytes).map_err(|e| {
            identity_error(
                Some(path),
                &format!("it is not a client identity file: {e}"),
            )
        })?,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Saved {
            client_id: format!("tether-client-{}", uuid::Uuid::new_v4()),
            reserved_up_to: 0,
        },
        Err(err) => return Err(fail("cannot read it", err)),
    };
    let result = change(&mut saved);
    // Written beside and renamed over, so a crash leaves the old or the new
    // file, never half of one.
    let temp = sibling(path, "tmp");
    let body = serde_json::to_vec_pretty(&saved)
        .map_err(|e| identity_error(Some(path), &format!("cannot encode it: {e}")))?;
    let write = || -> std::io::Result<()> {
        let mut file = File::create(&temp)?;
        file.write_all(&body)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    };
    write().map_err(|e| fail("cannot save it", e))?;
    drop(lock);
    Ok(result)
}

fn sibling(path: &Path, extension: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(extension);
    path.with_file_name(name)
}

fn identity_error(path: Option<&Path>, reason: &str) -> Error {
    Error::Identity {
        path: path.map(|p| p.display().to_string()).unwrap_or_default(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_persistent_identity_never_reuses_a_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/identity.json");
        let first = ClientIdentity::persistent(&path).unwrap();
        let a: Vec<u64> = (0..3).map(|_| first.next_seq().unwrap()).collect();
        assert_eq!(a, [1, 2, 3]);
        // A second process (or a later run) with the same file.
        let second = ClientIdentity::persistent(&path).unwrap();
        assert_eq!(second.client_id(), first.client_id());
        let b = second.next_seq().unwrap();
        assert!(b > BLOCK, "{b} must lie past the first run's block");
        // The first keeps using its own block; the second's never overlaps it.
        assert_eq!(first.next_seq().unwrap(), 4);
        drop((first, second));
        let third = ClientIdentity::persistent(&path).unwrap();
        assert!(third.next_seq().unwrap() > b);
    }

    #[test]
    fn a_corrupt_identity_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("identity.json");
        std::fs::write(&path, "not json").unwrap();
        let err = ClientIdentity::persistent(&path).unwrap_err();
        assert!(
            err.to_string().contains("not a client identity file"),
            "{err}"
        );
    }

    #[test]
    fn ephemeral_identities_are_distinct_and_count_from_one() {
        let a = ClientIdentity::ephemeral();
        let b = ClientIdentity::ephemeral();
        assert_ne!(a.client_id(), b.client_id());
        assert_eq!(a.next_seq().unwrap(), 1);
        assert_eq!(a.next_seq().unwrap(), 2);
    }
}
