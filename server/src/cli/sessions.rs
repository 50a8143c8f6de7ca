//! `tether sessions` and `tether show`: session lists and projections.

use super::*;

pub(super) async fn sessions(args: SessionsArgs) -> Outcome {
    let client = args.remote.client()?;
    let mut query = SessionQuery {
        project: args.project,
        state: args.state,
        limit: Some(if args.all { 1000 } else { args.limit }),
        cursor: None,
    };
    let mut items = Vec::new();
    loop {
        let page = client.sessions(&query).await?;
        items.extend(page.items);
        match page.next_cursor {
            Some(cursor) if args.all => {
                note(&format!("… {} sessions so far", items.len()));
                query.cursor = Some(cursor);
            }
            _ => break,
        }
    }
    if args.remote.json {
        return out_json(&items, false);
    }
    let rows: Vec<[String; 6]> = items
        .iter()
        .map(|s| {
            [
                s.id.clone(),
                clip(s.title.as_deref().unwrap_or("-"), 40),
                s.state.as_str().to_owned(),
                s.turns.to_string(),
                if s.resumable { "yes" } else { "no" }.to_owned(),
                s.updated_at.clone(),
            ]
        })
        .collect();
    print_table(
        ["ID", "TITLE", "STATE", "TURNS", "RESUMABLE", "UPDATED"],
        &rows,
    )
}

fn print_table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> Outcome {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        text
    };
    out(&line(header.to_vec()))?;
    for row in rows {
        out(&line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

pub(super) async fn agents(args: AgentsArgs) -> Outcome {
    let list = args.remote.client()?.agents().await?;
    if args.remote.json {
        return out_json(&list, true);
    }
    for agent in &list.agents {
        out(&format!(
            "{:<16} {:<8} {}",
            agent.provider, agent.kind, agent.description
        ))?;
    }
    Ok(())
}

pub(super) async fn show(args: ShowArgs) -> Outcome {
    let view = args.remote.client()?.session(&args.id).await?;
    if args.remote.json {
        return out_json(&view, true);
    }
    print_view(&view)
}

pub(super) fn print_view(view: &SessionView) -> Outcome {
    let state = match &view.cause {
        Some(cause) => format!("{} ({cause})", view.state.as_str()),
        None => view.state.as_str().to_owned(),
    };
    let mut lines = vec![
        format!("session     {}", view.id),
        format!("title       {}", view.title.as_deref().unwrap_or("-")),
        format!("project     {}", view.project),
        format!("provider    {}", view.provider),
        format!("state       {state}"),
        format!("resumable   {}", if view.resumable { "yes" } else { "no" }),
        format!("turns       {}", view.turns),
    ];
    if let Some(turn) = &view.projection.open_turn_id {
        lines.push(format!("open turn   {turn}"));
    }
    for (i, dir) in view.working_directories.iter().enumerate() {
        let label = if i == 0 { "directories" } else { "" };
        let shown = workdir::file_uri_path(dir).unwrap_or_else(|_| dir.clone());
        lines.push(format!(
            "{label:<11} {shown}{}",
            if i == 0 { "  (primary)" } else { "" }
        ));
    }
    if view.working_directories.is_empty() {
        lines.push("directories -".to_owned());
    }
    if let Some(chat) = &view.default_chat {
        lines.push(format!("chat        {chat}"));
    }
    if !view.projection.commands.is_empty() {
        let names: Vec<&str> = view
            .projection
            .commands
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        lines.push(format!("commands    {}", names.join(", ")));
    }
    lines.push(format!("last seq    {}", view.last_seq));
    lines.push(format!("created     {}", view.created_at));
    lines.push(format!("updated     {}", view.updated_at));
    for line in lines {
        out(&line)?;
    }
    Ok(())
}
