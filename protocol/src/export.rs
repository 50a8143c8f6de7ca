//! A session's transcript as Markdown: the conversation as a person reads
//! it (what was asked, what the agent answered, the tools it ran and the
//! files it edited, its questions and plans), folded from the envelopes in
//! order. Pure: the caller reads the envelopes (AHP `ActionEnvelope` JSON,
//! as the transcript endpoint gives them).
//!
//! It streams: [`Markdown::take`] gives each turn as soon as it is settled
//! and a later one has begun, so what the fold holds is the turns still
//! open, not the whole conversation.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

use serde_json::Value;

use crate::actions::PLAN_META;

/// One turn, as it will be written.
#[derive(Debug, Default)]
struct Turn {
    message: String,
    attachments: Vec<String>,
    /// Blocks of the answer, in order: text, tools, questions.
    blocks: Vec<Block>,
    /// Where each streamed part is in `blocks`.
    parts: HashMap<String, usize>,
    tools: HashMap<String, usize>,
    state: Option<String>,
    error: Option<String>,
    usage: Option<String>,
    started_at: Option<String>,
}

#[derive(Debug)]
enum Block {
    Text(String),
    Thinking(String),
    Tool {
        name: String,
        status: String,
        input: String,
        output: String,
        edits: Vec<String>,
    },
    Question {
        id: String,
        message: String,
        response: Option<String>,
    },
    Plan(Vec<(String, String)>),
}

/// The fold: feed it envelopes in `serverSeq` order, `take` what is
/// written as it goes, then `finish`.
#[derive(Debug, Default)]
pub struct Markdown {
    id: String,
    /// The session's title as its record has it, when the caller knows it.
    known_title: Option<String>,
    /// The last title its envelopes set.
    title: Option<String>,
    /// Turns not yet written, in the order they began.
    order: VecDeque<String>,
    turns: HashMap<String, Turn>,
    /// Turns written already.
    written: usize,
    headed: bool,
    envelopes: u64,
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("markdown")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

fn str_of<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// A file edit's line, from a tool result's `fileEdit` content.
fn edit_line(content: &Value) -> Option<String> {
    if str_of(content, "type") != "fileEdit" {
        return None;
    }
    let uri = content
        .pointer("/after/uri")
        .or_else(|| content.pointer("/before/uri"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let path = uri.strip_prefix("file://").unwrap_or(uri);
    let added = content.pointer("/diff/added").and_then(Value::as_u64);
    let removed = content.pointer("/diff/removed").and_then(Value::as_u64);
    Some(match (added, removed) {
        (Some(a), Some(r)) => format!("`{path}` (+{a} −{r})"),
        _ => format!("`{path}`"),
    })
}

impl Markdown {
    /// A fold for session `id`; its heading is the last title its
    /// envelopes set, else its first message, else `id`.
    pub fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            ..Self::default()
        }
    }

    /// A fold for session `id` whose heading is `title` (the session's own
    /// record, known before its envelopes are read), when it is not
    /// blank: a streamed document is headed before its end is read.
    pub fn titled(id: &str, title: Option<&str>) -> Self {
        Self {
            id: id.to_owned(),
            known_title: title.filter(|t| !t.trim().is_empty()).map(str::to_owned),
            ..Self::default()
        }
    }

    /// Takes one envelope.
    pub fn envelope(&mut self, envelope: &Value) {
        self.envelopes += 1;
        let action = &envelope["action"];
        let turn_id = str_of(action, "turnId").to_owned();
        match str_of(action, "type") {
            "session/titleChanged" => self.title = Some(str_of(action, "title").to_owned()),
            "session/metaChanged" => {
                if let Some(plan) =
                    action.pointer(&format!("/_meta/{}", PLAN_META.replace('/', "~1")))
                {
                    let steps = plan["entries"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|e| {
                            (
                                str_of(e, "content").to_owned(),
                                str_of(e, "status").to_owned(),
                            )
                        })
                        .collect();
                    if let Some(turn) = self.turns.get_mut(str_of(plan, "turnId")) {
                        turn.blocks.push(Block::Plan(steps));
                    }
                }
            }
            "chat/turnStarted" => {
                let message = &action["message"];
                let turn = Turn {
                    message: str_of(message, "text").to_owned(),
                    attachments: message["attachments"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|a| str_of(a, "label").to_owned())
                        .collect(),
                    started_at: action["startedAt"].as_str().map(str::to_owned),
                    ..Turn::default()
                };
                self.order.push_back(turn_id.clone());
                self.turns.insert(turn_id, turn);
            }
            "chat/inputRequested" => {
                // Into the turn that is still open.
                let open = self
                    .order
                    .iter()
                    .rev()
                    .find(|id| self.turns.get(*id).is_some_and(|t| t.state.is_none()))
                    .cloned();
                if let Some(turn) = open.and_then(|id| self.turns.get_mut(&id)) {
                    let request = &action["request"];
                    turn.blocks.push(Block::Question {
                        id: str_of(request, "id").to_owned(),
                        message: str_of(request, "message").to_owned(),
                        response: None,
                    });
                }
            }
            "chat/inputCompleted" => {
                let id = str_of(action, "requestId");
                for turn in self.turns.values_mut() {
                    for block in &mut turn.blocks {
                        if let Block::Question {
                            id: asked,
                            response,
                            ..
                        } = block
                            && asked == id
                        {
                            *response = Some(str_of(action, "response").to_owned());
                        }
                    }
                }
            }
            _ => {
                if let Some(turn) = self.turns.get_mut(&turn_id) {
                    turn.apply(action);
                }
            }
        }
    }

    /// What can be written now: the heading, once, and each turn that is
    /// settled and followed by a later one, oldest first (none is written
    /// out of order). Envelopes for a turn already written are not read.
    pub fn take(&mut self) -> String {
        let mut out = String::new();
        while self.order.len() > 1
            && self
                .order
                .front()
                .and_then(|id| self.turns.get(id))
                .is_none_or(|t| t.state.is_some())
        {
            self.head(&mut out);
            self.write_front(&mut out);
        }
        out
    }

    /// The rest of the document: the heading if nothing was taken yet, the
    /// turns not yet written, and the count of what it holds.
    pub fn finish(mut self) -> String {
        let mut out = String::new();
        self.head(&mut out);
        while !self.order.is_empty() {
            self.write_front(&mut out);
        }
        let _ = writeln!(
            out,
            "_Session `{}`: {} turns, {} envelopes._",
            self.id, self.written, self.envelopes
        );
        out
    }

    fn head(&mut self, out: &mut String) {
        if std::mem::replace(&mut self.headed, true) {
            return;
        }
        let title = self
            .known_title
            .clone()
            .or_else(|| self.title.clone().filter(|t| !t.trim().is_empty()))
            .or_else(|| {
                self.order
                    .front()
                    .and_then(|id| self.turns.get(id))
                    .map(|t| t.message.chars().take(60).collect::<String>())
                    .filter(|t| !t.trim().is_empty())
            })
            .unwrap_or_else(|| self.id.clone());
        let _ = writeln!(out, "# {title}\n");
    }

    fn write_front(&mut self, out: &mut String) {
        if let Some(turn) = self.order.pop_front().and_then(|id| self.turns.remove(&id)) {
            turn.write(out);
            self.written += 1;
        }
    }
}

impl Turn {
    fn apply(&mut self, action: &Value) {
        let tool_id = str_of(action, "toolCallId").to_owned();
        match str_of(action, "type") {
            "chat/responsePart" => {
                let part = &action["part"];
                match str_of(part, "kind") {
                    "markdown" | "reasoning" => {
                        let block = if str_of(part, "kind") == "markdown" {
                            Block::Text(str_of(part, "content").to_owned())
                        } else {
                            Block::Thinking(str_of(part, "content").to_owned())
                        };
                        self.parts
                            .insert(str_of(part, "id").to_owned(), self.blocks.len());
                        self.blocks.push(block);
                    }
                    "toolCall" => {
                        let call = &part["toolCall"];
                        self.start_tool(
                            str_of(call, "toolCallId"),
                            call.get("displayName").unwrap_or(&call["toolName"]),
                        );
                    }
                    _ => {}
                }
            }
            "chat/delta" | "chat/reasoning" => {
                let part = str_of(action, "partId").to_owned();
                let index = *self.parts.entry(part).or_insert_with(|| {
                    self.blocks.push(if str_of(action, "type") == "chat/delta" {
                        Block::Text(String::new())
                    } else {
                        Block::Thinking(String::new())
                    });
                    self.blocks.len() - 1
                });
                if let Some(Block::Text(t) | Block::Thinking(t)) = self.blocks.get_mut(index) {
                    t.push_str(str_of(action, "content"));
                }
            }
            "chat/toolCallStart" => self.start_tool(
                &tool_id,
                action.get("displayName").unwrap_or(&action["toolName"]),
            ),
            "chat/toolCallDelta" => {
                if let Some(Block::Tool { input, .. }) = self.tool(&tool_id) {
                    input.push_str(str_of(action, "content"));
                }
            }
            "chat/toolCallReady" => {
                if let Some(Block::Tool { input, status, .. }) = self.tool(&tool_id) {
                    if let Some(given) = action["toolInput"].as_str() {
                        *input = given.to_owned();
                    }
                    *status = "waiting for approval".into();
                }
            }
            "chat/toolCallConfirmed" => {
                let approved = action["approved"].as_bool().unwrap_or(false);
                if let Some(Block::Tool { status, .. }) = self.tool(&tool_id) {
                    *status = if approved { "approved" } else { "denied" }.into();
                }
            }
            "chat/toolCallComplete" => {
                let result = &action["result"];
                if let Some(Block::Tool {
                    status,
                    output,
                    edits,
                    ..
                }) = self.tool(&tool_id)
                {
                    let ok = result["success"].as_bool().unwrap_or(false);
                    *status = if ok { "completed" } else { "failed" }.into();
                    for content in result["content"].as_array().into_iter().flatten() {
                        match str_of(content, "type") {
                            "text" => {
                                if !output.is_empty() {
                                    output.push('\n');
                                }
                                output.push_str(str_of(content, "text"));
                            }
                            "terminal" => {
                                if let Some(preview) =
                                    content.pointer("/result/preview").and_then(Value::as_str)
                                {
                                    output.push_str(preview);
                                }
                            }
                            _ => edits.extend(edit_line(content)),
                        }
                    }
                }
            }
            "chat/usage" => {
                let usage = &action["usage"];
                let mut said = match (
                    usage["inputTokens"].as_u64(),
                    usage["outputTokens"].as_u64(),
                ) {
                    (Some(i), Some(o)) => format!("{i} tokens in, {o} out"),
                    _ => String::new(),
                };
                if let Some(cost) = usage.pointer("/_meta/tether~1cost") {
                    let amount = cost["amount"].as_f64().unwrap_or_default();
                    if !said.is_empty() {
                        said.push_str("; ");
                    }
                    let _ = write!(said, "cost so far {amount:.4} {}", str_of(cost, "currency"));
                }
                if !said.is_empty() {
                    self.usage = Some(said);
                }
            }
            "chat/turnComplete" => self.state = Some("complete".into()),
            "chat/turnCancelled" => self.state = Some("cancelled".into()),
            "chat/error" => {
                self.state = Some("error".into());
                self.error = action
                    .pointer("/part/error/message")
                    .or_else(|| action.pointer("/error/message"))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
            }
            _ => {}
        }
    }

    fn start_tool(&mut self, id: &str, name: &Value) {
        self.tools.insert(id.to_owned(), self.blocks.len());
        self.blocks.push(Block::Tool {
            name: text(name),
            status: "running".into(),
            input: String::new(),
            output: String::new(),
            edits: Vec::new(),
        });
    }

    fn tool(&mut self, id: &str) -> Option<&mut Block> {
        let index = *self.tools.get(id)?;
        self.blocks.get_mut(index)
    }

    fn write(&self, out: &mut String) {
        let when = self
            .started_at
            .as_deref()
            .map(|at| format!(" ({at})"))
            .unwrap_or_default();
        let _ = writeln!(out, "## You{when}\n\n{}\n", self.message.trim_end());
        if !self.attachments.is_empty() {
            let _ = writeln!(out, "_Attached: {}_\n", self.attachments.join(", "));
        }
        let _ = writeln!(out, "## Agent\n");
        for block in &self.blocks {
            match block {
                Block::Text(t) => {
                    let _ = writeln!(out, "{}\n", t.trim_end());
                }
                Block::Thinking(t) => {
                    let quoted: Vec<String> = t.lines().map(|l| format!("> {l}")).collect();
                    let _ = writeln!(out, "> _Thinking_\n>\n{}\n", quoted.join("\n"));
                }
                Block::Tool {
                    name,
                    status,
                    input,
                    output,
                    edits,
                } => {
                    let _ = writeln!(out, "**Tool** {name}: {status}\n");
                    if !input.is_empty() {
                        let _ = writeln!(out, "{}\n", fenced(input));
                    }
                    for edit in edits {
                        let _ = writeln!(out, "- edited {edit}");
                    }
                    if !edits.is_empty() {
                        out.push('\n');
                    }
                    if !output.is_empty() {
                        let _ = writeln!(out, "{}\n", fenced(output));
                    }
                }
                Block::Question {
                    message, response, ..
                } => {
                    let answer = response.as_deref().unwrap_or("not answered");
                    let _ = writeln!(out, "**The agent asked:** {message} ({answer})\n");
                }
                Block::Plan(steps) => {
                    let _ = writeln!(out, "**Plan**\n");
                    for (step, status) in steps {
                        let mark = if status == "completed" { "x" } else { " " };
                        let _ = writeln!(out, "- [{mark}] {step}");
                    }
                    out.push('\n');
                }
            }
        }
        if let Some(error) = &self.error {
            let _ = writeln!(out, "**Error:** {error}\n");
        }
        let mut footer = vec![self.state.clone().unwrap_or_else(|| "running".into())];
        footer.extend(self.usage.clone());
        let _ = writeln!(out, "_{}_\n", footer.join("; "));
    }
}

/// `text` in a code fence longer than any run of backticks inside it.
fn fenced(text: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}text\n{}\n{fence}", text.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(seq: u64, action: Value) -> Value {
        json!({"channel": "ahp-chat:/s.main", "serverSeq": seq, "action": action})
    }

    #[test]
    fn a_turn_reads_as_the_conversation() {
        let mut md = Markdown::new("s");
        for (i, action) in [
            json!({"type": "session/titleChanged", "title": "Fix the build"}),
            json!({"type": "chat/turnStarted", "turnId": "t1", "startedAt": "2026-12-02T10:00:00Z",
                   "message": {"text": "why does it fail?", "attachments": [{"type": "resource", "label": "log.txt"}]}}),
            json!({"type": "chat/responsePart", "turnId": "t1", "part": {"kind": "markdown", "id": "p1", "content": "It "}}),
            json!({"type": "chat/delta", "turnId": "t1", "partId": "p1", "content": "**fails**."}),
            json!({"type": "chat/toolCallStart", "turnId": "t1", "toolCallId": "c1", "toolName": "sh", "displayName": "Run tests"}),
            json!({"type": "chat/toolCallComplete", "turnId": "t1", "toolCallId": "c1", "result": {"success": true,
                   "content": [{"type": "text", "text": "ok ```"}, {"type": "fileEdit", "after": {"uri": "file:///a.rs"}, "diff": {"added": 2, "removed": 1}}]}}),
            json!({"type": "chat/turnComplete", "turnId": "t1"}),
        ]
        .into_iter()
        .enumerate()
        {
            md.envelope(&env(i as u64 + 1, action));
        }
        let text = md.finish();
        assert!(text.starts_with("# Fix the build\n"), "{text}");
        assert!(
            text.contains("## You (2026-12-02T10:00:00Z)\n\nwhy does it fail?"),
            "{text}"
        );
        assert!(text.contains("_Attached: log.txt_"), "{text}");
        assert!(text.contains("It **fails**."), "{text}");
        assert!(text.contains("**Tool** Run tests: completed"), "{text}");
        assert!(text.contains("- edited `/a.rs` (+2 −1)"), "{text}");
        // An output with a fence inside is fenced longer.
        assert!(text.contains("````text\nok ```\n````"), "{text}");
        assert!(text.contains("_complete_"), "{text}");
    }

    #[test]
    fn settled_turns_are_written_as_soon_as_a_later_one_begins() {
        let turn = |id: &str, text: &str| json!({"type": "chat/turnStarted", "turnId": id, "message": {"text": text}});
        let mut md = Markdown::titled("s", Some("From the record"));
        md.envelope(&env(1, turn("t1", "first")));
        md.envelope(&env(
            2,
            json!({"type": "chat/delta", "turnId": "t1", "partId": "p", "content": "one"}),
        ));
        assert_eq!(md.take(), "", "nothing is settled");
        md.envelope(&env(
            3,
            json!({"type": "chat/turnComplete", "turnId": "t1"}),
        ));
        assert_eq!(md.take(), "", "the newest turn may still hear of itself");
        md.envelope(&env(4, turn("t2", "second")));
        md.envelope(&env(5, turn("t3", "third")));
        let taken = md.take();
        assert!(taken.starts_with("# From the record\n"), "{taken}");
        assert!(taken.contains("first") && taken.contains("one"), "{taken}");
        assert!(
            !taken.contains("second"),
            "t2 is open, so it and all after it wait: {taken}"
        );
        md.envelope(&env(
            6,
            json!({"type": "chat/turnCancelled", "turnId": "t2"}),
        ));
        let taken = md.take();
        assert!(
            taken.contains("second") && !taken.contains("# From"),
            "{taken}"
        );
        let rest = md.finish();
        assert!(
            rest.contains("third") && rest.contains("_running_"),
            "{rest}"
        );
        assert!(
            rest.ends_with("_Session `s`: 3 turns, 6 envelopes._\n"),
            "{rest}"
        );
    }
}
