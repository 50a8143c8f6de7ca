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
        follow_turn(&mut stream, &chat, &turn_id, args.remote.json, args.yes),
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

/// Prints the agent's answer to `turn_id` as it streams, until the turn
/// ends: text to stdout as it arrives, thoughts, tool calls and permission
/// requests to stderr. A permission request is approved with `yes`, asked
/// on a terminal, or left to another client.
async fn follow_turn(
    stream: &mut SessionStream,
    chat: &str,
    turn_id: &str,
    json: bool,
    yes: bool,
) -> Outcome {
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
            "chat/responsePart" if !json && action["part"]["kind"] == "reasoning" => {
                report(&format!(
                    "(thinking) {}",
                    action["part"]["content"].as_str().unwrap_or_default()
                ));
            }
            "chat/responsePart" | "chat/delta" if !json => {
                let content = action["part"]["content"]
                    .as_str()
                    .or(action["content"].as_str());
                if let Some(content) = content {
                    write_stdout(content)?;
                    open_line = !content.ends_with('\n');
                }
            }
            "chat/toolCallStart" if !json => {
                report(&format!(
                    "⚙ {}",
                    action["displayName"].as_str().unwrap_or("tool call")
                ));
            }
            "chat/toolCallComplete" if !json => {
                let done = if action["result"]["success"] == true {
                    "done"
                } else {
                    "failed"
                };
                report(&format!(
                    "⚙ {} {done}",
                    action["result"]["pastTenseMessage"]
                        .as_str()
                        .unwrap_or("tool call")
                ));
            }
            "chat/toolCallReady" if action.get("confirmed").is_none() => {
                if let Some(confirm) = permission(&action, turn_id, yes) {
                    match stream.dispatch(chat, confirm).await? {
                        Dispatched::Rejected { reason, .. } => {
                            report(&format!("tether: the answer was refused: {reason}"))
                        }
                        Dispatched::Accepted(_) => {}
                    }
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

/// What the agent does besides writing text (tool calls, thoughts,
/// permission requests), on stderr whether or not it is a terminal.
fn report(message: &str) {
    eprintln!("{message}");
}

/// The answer to a permission request: approved with `yes`, asked on a
/// terminal, or `None` (another client answers).
fn permission(ready: &Value, turn_id: &str, yes: bool) -> Option<Value> {
    use std::io::IsTerminal;
    let title = ready["confirmationTitle"]
        .as_str()
        .or(ready["invocationMessage"].as_str())
        .unwrap_or("a tool call");
    let options = ready["options"].as_array().cloned().unwrap_or_default();
    let first = |kind: &str| {
        options
            .iter()
            .find(|o| o["kind"] == kind)
            .and_then(|o| o["id"].as_str())
            .map(str::to_owned)
    };
    let approved = if yes {
        report(&format!("tether: approving {title} (--yes)"));
        true
    } else if std::io::stdin().is_terminal() {
        eprint!("tether: the agent asks to run {title}. Allow? [y/N] ");
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        matches!(line.trim(), "y" | "Y" | "yes")
    } else {
        report(&format!(
            "tether: the agent asks to run {title}; waiting for a client to answer (--yes approves)"
        ));
        return None;
    };
    let mut answer = json!({"type": "chat/toolCallConfirmed", "turnId": turn_id,
        "toolCallId": ready["toolCallId"], "approved": approved});
    if let Some(option) = first(if approved { "approve" } else { "deny" }) {
        answer["selectedOptionId"] = json!(option);
    }
    Some(answer)
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
