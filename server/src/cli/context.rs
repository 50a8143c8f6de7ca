//! `tether context get|put`: working-context lookup and save.

use super::*;

pub(super) async fn context_get(args: ContextGetArgs) -> Outcome {
    let loaded = args
        .remote
        .client()?
        .working_context(&args.project, &args.session)
        .await?;
    if !loaded.found {
        let others = if loaded.other_sessions.is_empty() {
            "none of its sessions has one".to_owned()
        } else {
            format!("sessions with one: {}", loaded.other_sessions.join(", "))
        };
        return Err(Failed::new(
            Exit::NotFound,
            format!(
                "no working context saved for session {} in project {}; {others}",
                args.session, args.project
            ),
        ));
    }
    out_json(&loaded, !args.remote.json)
}

pub(super) async fn context_put(args: ContextPutArgs) -> Outcome {
    let mut body = Vec::new();
    let read = if args.file == "-" {
        std::io::stdin().read_to_end(&mut body).map(|_| ())
    } else {
        std::fs::read(&args.file).map(|bytes| body = bytes)
    };
    read.map_err(|e| Failed::new(Exit::Usage, format!("cannot read {}: {e}", args.file)))?;
    let context: WorkingContext = serde_json::from_slice(&body).map_err(|e| {
        Failed::new(
            Exit::Usage,
            format!("{} is not a working context: {e}", args.file),
        )
    })?;
    let saved = args
        .remote
        .client()?
        .save_working_context(&args.project, &args.session, &context)
        .await?;
    if args.remote.json {
        return out_json(&saved, false);
    }
    out(&format!(
        "saved working context of session {} in project {} at {}",
        saved.session, saved.project, saved.saved_at
    ))
}
