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

/// `tether search`: one hit per line, best first: where, what and an
/// extract with the matching words in brackets.
pub(super) async fn search(args: SearchArgs) -> Outcome {
    let query = tether_client::SearchQuery {
        q: args.query,
        project: args.project,
        agent: args.agent,
        state: args.state,
        since: args.since,
        until: args.until,
        limit: Some(args.limit),
        cursor: None,
    };
    let page = args.remote.client()?.search(&query).await?;
    if args.remote.json {
        return out_json(&page.items, false);
    }
    if page.items.is_empty() {
        note("no matches");
        return Ok(());
    }
    let rows: Vec<[String; 5]> = page
        .items
        .iter()
        .map(|hit| {
            [
                hit.session_id.clone(),
                hit.seq.to_string(),
                hit.kind.clone(),
                hit.at.clone(),
                clip(&marked(&hit.snippet_html), 100),
            ]
        })
        .collect();
    print_table(["SESSION", "SEQ", "KIND", "AT", "MATCH"], &rows)
}

/// `tether usage`: one line per group and currency.
pub(super) async fn usage(args: UsageArgs) -> Outcome {
    let params = tether_client::UsageParams {
        since: args.since,
        until: args.until,
        project: args.project,
        agent: args.agent,
        by: Some(args.by),
    };
    let client = args.remote.client()?;
    if args.csv {
        return write_stdout(&client.usage_csv(&params).await?);
    }
    let report = client.usage(&params).await?;
    if args.remote.json {
        return out_json(&report, false);
    }
    if report.rows.is_empty() {
        note("no usage reported in this range");
        return Ok(());
    }
    let group = |row: &tether_protocol::rest::UsageLine| {
        [&row.project, &row.principal, &row.agent, &row.model]
            .into_iter()
            .flatten()
            .map(|v| if v.is_empty() { "-" } else { v.as_str() })
            .collect::<Vec<_>>()
            .join(" · ")
    };
    let rows: Vec<[String; 5]> = report
        .rows
        .iter()
        .map(|row| {
            [
                clip(&group(row), 60),
                row.input_tokens.to_string(),
                row.output_tokens.to_string(),
                if row.currency.is_empty() {
                    "-".to_owned()
                } else {
                    format!("{:.4} {}", row.cost, row.currency)
                },
                row.sessions.to_string(),
            ]
        })
        .collect();
    let by = report.by.join(" · ").to_uppercase();
    let header = if by.is_empty() { "ALL".to_owned() } else { by };
    print_table(
        [
            header.as_str(),
            "TOKENS IN",
            "TOKENS OUT",
            "COST",
            "SESSIONS",
        ],
        &rows,
    )
}

/// A snippet's HTML as text, each match in brackets.
fn marked(html: &str) -> String {
    html.replace("<mark>", "[")
        .replace("</mark>", "]")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
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
