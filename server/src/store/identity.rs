//! A host's stable identity on a shared Postgres database (`--host-id`):
//! the id it writes and holds leases as, kept across restarts, claimed by
//! one live process at a time.
//!
//! The claim is a session-level advisory lock held on a connection of its
//! own for the life of the process. The database drops it with the
//! connection, so a host killed without warning frees its identity as soon
//! as its connection closes, and a restarted host can take its own leases
//! back at once (their holder is its id) instead of waiting them out.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio_util::sync::{CancellationToken, DropGuard};

/// The advisory-lock class of identity claims (the id's hash is the key).
const CLAIM_CLASS: i32 = 0x7465_7468;

/// How often the claim's connection is checked, and re-taken if it broke.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The longest a host id may be.
const MAX_LEN: usize = 64;

/// Checks a configured host id: letters, digits, `.`, `_`, `-`.
pub fn validate(id: &str) -> Result<(), String> {
    let fine = !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if fine {
        Ok(())
    } else {
        Err(format!(
            "host id {id:?} is not usable: 1 to {MAX_LEN} letters, digits, '.', '_' or '-'"
        ))
    }
}

/// Times a taken id is asked for again (250 ms apart) before it is refused.
const CLAIM_TRIES: u32 = 20;

/// A held claim on a host id; dropping it lets the identity go.
#[derive(Debug)]
pub struct HostClaim {
    _held: DropGuard,
}

/// Claims `id` for this process, or says which identity is taken.
pub async fn claim(connect: &PgConnectOptions, id: &str) -> Result<HostClaim, String> {
    validate(id)?;
    // A process of this id killed a moment ago holds the claim until
    // Postgres notices its connection is gone: ask again for a few seconds
    // before calling the id taken.
    let mut tries = 0;
    let conn = loop {
        match take(connect, id).await {
            Ok(conn) => break conn,
            Err(err) if tries < CLAIM_TRIES && err.contains("claimed by another") => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            Err(err) => return Err(err),
        }
    };
    let stop = CancellationToken::new();
    tokio::spawn(keep(conn, connect.clone(), id.to_owned(), stop.clone()));
    Ok(HostClaim {
        _held: stop.drop_guard(),
    })
}

async fn take(connect: &PgConnectOptions, id: &str) -> Result<PgConnection, String> {
    let mut conn = connect
        .connect()
        .await
        .map_err(|e| format!("cannot claim host id {id:?}: {e}"))?;
    let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
        .bind(CLAIM_CLASS)
        .bind(id)
        .fetch_one(&mut conn)
        .await
        .map_err(|e| format!("cannot claim host id {id:?}: {e}"))?;
    if taken {
        Ok(conn)
    } else {
        let _ = conn.close().await;
        Err(format!(
            "host id {id:?} is claimed by another live process on this database \
             (another `tether serve` with the same --host-id); give each host its own"
        ))
    }
}

/// Holds the claim's connection until `stop`; checks it now and then and
/// takes the claim again on a new connection when it broke (a database
/// restart drops every lock).
async fn keep(
    mut conn: PgConnection,
    connect: PgConnectOptions,
    id: String,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
        if conn.ping().await.is_ok() {
            continue;
        }
        tracing::warn!(host = %id, "the host id's claim connection broke; claiming it again");
        match take(&connect, &id).await {
            Ok(fresh) => conn = fresh,
            Err(err) => tracing::error!(host = %id, error = %err, "host id claim not renewed"),
        }
    }
    let _ = conn.close().await;
}
