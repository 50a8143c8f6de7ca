//! `tether send` and `tether dirs`: dispatching turns and working-directory changes.

use super::*;

pub(super) async fn send(args: SendArgs) -> Outcome {
    let client = args.remote.client()?;
    let view = client.session(&args.id).await?;
    let chat = view.default_chat.clone().ok_or_else(|| {
        Failed::new(
            Exit::Failure,
            format!("session {} has no chat to send to", view.id),
        )
    })?;
    let mut stream =
        SessionStream::open(args.remote.stream_config()?, vec![chat.clone()], Start::Now).await?;
    let turn_id = format!("turn-{}", uuid::Uuid::new_v4());
    let started_at = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string();
    let action = json!({
        "type": "chat/turnStarted",
        "turnId": turn_id,
        "startedAt": started_at,
        "message": {"text": args.text, "origin": {"kind": "user"}},
    });
    match stream.dispatch(&chat, action).await? {
        Dispatched::Rejected { reason, .. } => return Err(Failed::new(Exit::Rejected, reason)),
        Dispatched::Accepted(_) => {}
    }
    note("… waiting for the agent");
    let answer = tokio::time::timeout(
        Duration::from_secs(args.timeout_secs),
        follow_turn(&mut stream, &turn_id, args.remote.json),
    )
    .await;
    match answer {
        Ok(result) => result,
        Err(_) => Err(Failed::new(
            Exit::Failure,
            format!(
                "no end of turn {turn_id} within {}s; it continues on the server",
                args.timeout_secs
            ),
        )),
    }
}

/// Prints the agent's answer to `turn_id` as it streams, until the turn ends.
async fn follow_turn(stream: &mut SessionStream, turn_id: &str, json: bool) -> Outcome {
    let mut open_line = false;
    while let Some(event) = stream.next().await {
        let envelope = match event {
            StreamEvent::Envelope(envelope) => envelope,
            StreamEvent::Failed { reason } => return Err(Failed::new(Exit::Unreachable, reason)),
            StreamEvent::Disconnected { reason, .. } => {
                note(&format!("tether: connection lost ({reason}); reconnecting"));
                continue;
            }
            _ => continue,
        };
        let action = serde_json::to_value(&envelope.action)
            .map_err(|e| Failed::new(Exit::Failure, e.to_string()))?;
        if action["turnId"].as_str() != Some(turn_id) {
            continue;
        }
        if json {
            out_json(&*envelope, false)?;
        }
        match action["type"].as_str().unwrap_or_default() {
            "chat/responsePart" if !json => {
                if let Some(content) = action["part"]["content"].as_str() {
                    write_stdout(content)?;
                    open_line = !content.ends_with('\n');
                }
            }
            "chat/turnComplete" => {
                if open_line {
                    out("")?;
                }
                return Ok(());
            }
            "chat/turnCancelled" => {
                return Err(Failed::new(Exit::Failure, "the turn was cancelled"));
            }
            "chat/error" => {
                let message = summary(&action);
                return Err(Failed::new(
                    Exit::Failure,
                    format!("the agent failed: {message}"),
                ));
            }
            _ => {}
        }
    }
    Err(Failed::new(Exit::Unreachable, "the session stream ended"))
}

pub(super) async fn dirs(args: DirsArgs) -> Outcome {
    let client = args.remote.client()?;
    let identity = args.remote.identity()?;
    let actions: Vec<Value> = match &args.change {
        DirsChange::Add { dirs } => dirs
            .iter()
            .map(|d| Ok(json!({"type": "session/workingDirectorySet", "directory": dir_uri(d)?})))
            .collect::<Result<_, Failed>>()?,
        DirsChange::Remove { dirs } => dirs
            .iter()
            .map(|d| {
                Ok(json!({"type": "session/workingDirectoryRemoved", "directory": dir_uri(d)?}))
            })
            .collect::<Result<_, Failed>>()?,
        DirsChange::Replace { old, new } => vec![json!({
            "type": "session/workingDirectoryReplaced",
            "directory": dir_uri(old)?,
            "replacement": dir_uri(new)?,
        })],
    };
    for action in actions {
        let request = DispatchRequest {
            client_id: identity.client_id().to_owned(),
            client_seq: identity.next_seq()?,
            channel: None,
            action,
        };
        client.dispatch(&args.id, &request).await?;
    }
    let view = client.session(&args.id).await?;
    if args.remote.json {
        return out_json(&view.working_directories, false);
    }
    for dir in &view.working_directories {
        out(&workdir::file_uri_path(dir).unwrap_or_else(|_| dir.clone()))?;
    }
    Ok(())
}

/// A directory argument as a `file:` URI: URIs as given, paths made
/// absolute against the current directory (the server resolves symlinks).
pub(super) fn dir_uri(arg: &str) -> Result<String, Failed> {
    if arg.starts_with("file:") {
        return Ok(arg.to_owned());
    }
    let absolute = std::path::absolute(arg)
        .map_err(|e| Failed::new(Exit::Usage, format!("{arg:?} is not a usable path: {e}")))?;
    let text = absolute
        .to_str()
        .ok_or_else(|| Failed::new(Exit::Usage, format!("{arg:?} is not valid UTF-8")))?;
    workdir::path_to_file_uri(text).map_err(|e| Failed::new(Exit::Usage, e.to_string()))
}
