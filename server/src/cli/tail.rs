//! `tether tail`: a resumable stream of a session's envelopes.

use super::*;

pub(super) async fn tail(args: TailArgs) -> Outcome {
    let client = args.remote.client()?;
    let view = client.session(&args.id).await?;
    let session_uri = view.resource.clone();
    let mut channels = vec![session_uri.clone()];
    channels.extend(view.default_chat.clone());
    let mut printer = TailPrinter {
        json: args.remote.json,
        session: session_uri,
        left: args.count,
    };

    let start = if args.from_start {
        let mut after = 0;
        loop {
            let page = client.transcript(&args.id, after, 1000).await?;
            for envelope in &page.envelopes {
                if let Some(channel) = envelope["channel"].as_str()
                    && !channels.iter().any(|c| c == channel)
                {
                    channels.push(channel.to_owned());
                }
                if printer.envelope(envelope)? {
                    return Ok(());
                }
            }
            match page.next_after {
                Some(next) => {
                    after = next;
                    note(&format!("… {after} (serverSeq) read"));
                }
                None => {
                    after = page
                        .envelopes
                        .last()
                        .and_then(|e| e["serverSeq"].as_u64())
                        .unwrap_or(after);
                    break;
                }
            }
        }
        Start::After(after)
    } else {
        Start::Now
    };

    // Tail only reads: an ephemeral identity, no identity file.
    let config = args
        .remote
        .with_token(StreamConfig::new(args.remote.url.clone()));
    let mut stream = SessionStream::open(config, channels, start).await?;
    while let Some(event) = stream.next().await {
        match event {
            StreamEvent::Snapshot(snapshot) => printer.snapshot(&snapshot)?,
            StreamEvent::Envelope(envelope) => {
                let value = serde_json::to_value(&*envelope)
                    .map_err(|e| Failed::new(Exit::Failure, e.to_string()))?;
                // A chat the session gains is followed from then on.
                if let Some(chat) = added_chat(&value, &printer.session)
                    && let Err(err) = stream.subscribe(chat).await
                {
                    eprintln!("tether: cannot follow the new chat {chat}: {err}");
                }
                if printer.envelope(&value)? {
                    return Ok(());
                }
            }
            StreamEvent::Disconnected { reason, retry_in } => note(&format!(
                "tether: connection lost ({reason}); reconnecting in {:.1}s",
                retry_in.as_secs_f64()
            )),
            StreamEvent::Resumed { replayed } => {
                note(&format!(
                    "tether: reconnected; {replayed} missed envelopes follow"
                ));
            }
            StreamEvent::Resynced => eprintln!(
                "tether: reconnected after too long a gap to replay; showing fresh snapshots"
            ),
            StreamEvent::Gone { channels } => {
                eprintln!("tether: the server no longer has {}", channels.join(", "));
            }
            StreamEvent::Failed { reason } => {
                return Err(Failed::new(Exit::Unreachable, reason));
            }
            _ => {}
        }
    }
    Err(Failed::new(Exit::Unreachable, "the session stream ended"))
}

/// The chat a `session/chatAdded` envelope on `session` brings.
fn added_chat<'a>(envelope: &'a Value, session: &str) -> Option<&'a str> {
    let action = &envelope["action"];
    (envelope["channel"] == session && action["type"] == "session/chatAdded")
        .then(|| action["summary"]["resource"].as_str())
        .flatten()
}

struct TailPrinter {
    json: bool,
    session: String,
    left: Option<u64>,
}

impl TailPrinter {
    /// Prints one envelope; true once `--count` envelopes have been printed.
    fn envelope(&mut self, envelope: &Value) -> Result<bool, Failed> {
        if self.json {
            out_json(envelope, false)?;
        } else {
            let channel = envelope["channel"].as_str().unwrap_or_default();
            let action = &envelope["action"];
            out(&format!(
                "{:>8}  {:<12}  {:<34}  {}",
                envelope["serverSeq"].as_u64().unwrap_or_default(),
                self.label(channel),
                action["type"].as_str().unwrap_or("?"),
                summary(action),
            ))?;
        }
        Ok(match &mut self.left {
            Some(left) => {
                *left = left.saturating_sub(1);
                *left == 0
            }
            None => false,
        })
    }

    fn snapshot(&self, snapshot: &ahp_types::state::Snapshot) -> Outcome {
        if self.json {
            return out_json(&json!({"snapshot": snapshot}), false);
        }
        out(&format!(
            "# {} at serverSeq {}",
            snapshot.resource, snapshot.from_seq
        ))
    }

    /// `session`, `chat:<name>` or the channel URI.
    fn label(&self, channel: &str) -> String {
        if channel == self.session {
            return "session".to_owned();
        }
        match Channel::parse(channel) {
            Ok(Channel::Chat(id)) => match id.rsplit_once('.') {
                Some((_, name)) => format!("chat:{name}"),
                None => format!("chat:{id}"),
            },
            _ => channel.to_owned(),
        }
    }
}

/// A short, single-line gist of an action.
pub(super) fn summary(action: &Value) -> String {
    let text = |v: &Value| v.as_str().map(str::to_owned);
    let found = text(&action["title"])
        .or_else(|| text(&action["message"]["text"]))
        .or_else(|| text(&action["part"]["content"]))
        .or_else(|| {
            let directory = text(&action["directory"])?;
            Some(match text(&action["replacement"]) {
                Some(replacement) => format!("{directory} -> {replacement}"),
                None => directory,
            })
        })
        .or_else(|| text(&action["cause"]))
        .or_else(|| text(&action["reason"]))
        .or_else(|| text(&action["error"]["message"]))
        .or_else(|| text(&action["turnId"]).map(|t| format!("turn {t}")))
        .or_else(|| text(&action["acpSessionRef"]).map(|r| format!("agent session {r}")))
        .or_else(|| {
            let names: Vec<&str> = action["commands"]
                .as_array()?
                .iter()
                .filter_map(|c| c["name"].as_str())
                .collect();
            Some(format!("commands: {}", names.join(", ")))
        });
    found.map(|t| clip(&t, 80)).unwrap_or_default()
}

/// `text` on one line, at most `max` characters.
pub(super) fn clip(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}
