//! Full-text search over transcripts: what of an envelope is searchable,
//! how a person's query is read, and the snippet of a hit. Pure: the store
//! writes the documents in the transaction that appends their envelope and
//! runs the queries (SQLite FTS5, Postgres `tsvector`), both from what this
//! module decides, so the two backends find the same things.
//!
//! A document is one thing a person would look for: a session's title, a
//! message, an answer, a tool call's title, the paths a tool call edited,
//! an agent's question. Each has a key unique within its session, so a
//! streamed answer is not one document per delta. A long answer is
//! indexed in pieces of about [`PIECE_BYTES`] (see [`pieces`]): a delta
//! rewrites only the piece it extends, so what it costs does not grow with
//! the answer.

use serde_json::Value;

use crate::actions::action_type;
use crate::model::SessionModel;

/// The longest text indexed for one document, in bytes; the rest of a very
/// long message is not searchable (it stays in the transcript). An answer
/// is searchable whole, in pieces.
pub const MAX_DOC_BYTES: usize = 64 * 1024;

/// How long a piece of an answer is before it ends (at the next character
/// that separates words). Each piece is a document: a streamed delta
/// rewrote the whole answer's document, up to [`MAX_DOC_BYTES`], on every
/// commit; it rewrites one piece now. Each piece's document also holds
/// the last words of the piece before it (see [`PIECE_OVERLAP`]), so a
/// phrase across a piece's end is found; the search matches a query's
/// terms across the pieces of one answer, however far apart, and merges
/// those pieces into one hit.
pub const PIECE_BYTES: usize = 4 * 1024;

/// How far a piece's document reaches back into the piece before it, in
/// bytes (to the start of a word): a phrase across a piece's end is found
/// in the later piece. That text never changes once the piece begins, so a
/// delta still rewrites only the pieces it reaches.
pub const PIECE_OVERLAP: usize = 256;

/// The longest query accepted, in characters.
pub const MAX_QUERY_CHARS: usize = 512;

/// The most terms a query may have.
pub const MAX_QUERY_TERMS: usize = 16;

/// One searchable document of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchDoc {
    /// Unique within the session; a later document with the same key
    /// replaces the earlier one.
    pub key: String,
    /// The chat it was said in (`None`: the session itself).
    pub chat: Option<String>,
    /// The turn it belongs to.
    pub turn_id: Option<String>,
    /// What it is: `title`, `message`, `answer`, `tool`, `edit`, `question`.
    pub kind: &'static str,
    /// The text, at most [`MAX_DOC_BYTES`].
    pub text: String,
}

fn str_of<'a>(value: &'a Value, key: &str) -> &'a str {
    crate::actions::field(value, key)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn cut(mut text: String) -> String {
    if text.len() > MAX_DOC_BYTES {
        text.truncate(text.floor_char_boundary(MAX_DOC_BYTES));
    }
    text
}

/// The pieces of an answer, as byte ranges of its text. Each but the last
/// ends at the first character that separates words at or past
/// [`PIECE_BYTES`] from its start (that character is in no piece), or at
/// [`MAX_DOC_BYTES`] from its start when none comes before; the last runs
/// to the end. Text appended later never moves an end that exists, so a
/// delta changes only the pieces it reaches.
pub fn pieces(text: &str) -> Vec<std::ops::Range<usize>> {
    let mut found = Vec::new();
    let mut start = 0;
    loop {
        if start + PIECE_BYTES >= text.len() {
            break;
        }
        let from = text.ceil_char_boundary(start + PIECE_BYTES);
        let cap = start + MAX_DOC_BYTES;
        let limit = text.floor_char_boundary(cap);
        match text[from..limit].find(|c: char| !c.is_alphanumeric()) {
            Some(at) => {
                let end = from + at;
                found.push(start..end);
                // Past the separating character.
                start = end + text[end..].chars().next().map_or(1, char::len_utf8);
            }
            // No word ends before a document's limit: cut there.
            None if cap <= text.len() => {
                found.push(start..limit);
                start = limit;
            }
            None => break,
        }
    }
    found.push(start..text.len());
    found
}

/// Where the document of the piece starting at byte `start` of `text`
/// begins: up to [`PIECE_OVERLAP`] bytes before it, never inside a word
/// (a word longer than that is left out).
pub fn piece_lead(text: &str, start: usize) -> usize {
    let mut at = text.ceil_char_boundary(start.saturating_sub(PIECE_OVERLAP));
    if text[..at].ends_with(char::is_alphanumeric) {
        // Inside a word: from where it ends.
        match text[at..start].find(|c: char| !c.is_alphanumeric()) {
            Some(end) => at += end,
            None => return start,
        }
    }
    at
}

/// The documents an accepted action writes, read from the action and the
/// session's model after it was folded in (a delta's are the pieces of its
/// part's text so far that it reached). Empty when it says nothing
/// searchable.
pub fn doc(model: &SessionModel, channel: &str, action: &Value) -> Vec<SearchDoc> {
    let turn = str_of(action, "turnId");
    let doc = |key: String, kind: &'static str, text: String| {
        (!text.trim().is_empty()).then(|| SearchDoc {
            key,
            chat: (!model.is_own_channel(channel)).then(|| channel.to_owned()),
            turn_id: (!turn.is_empty()).then(|| turn.to_owned()),
            kind,
            text: cut(text),
        })
    };
    let make =
        |key: String, kind: &'static str, text: String| doc(key, kind, text).into_iter().collect();
    // An answer's pieces from byte `from` of its text on: the first keeps
    // the answer's key.
    let answer = |key: String, text: &str, from: usize| -> Vec<SearchDoc> {
        pieces(text)
            .into_iter()
            .enumerate()
            .filter(|(_, range)| range.end > from || range.end == text.len())
            .filter_map(|(n, range)| {
                let key = if n == 0 {
                    key.clone()
                } else {
                    format!("{key}~{n}")
                };
                doc(
                    key,
                    "answer",
                    text[piece_lead(text, range.start)..range.end].to_owned(),
                )
            })
            .collect()
    };
    let Some(kind) = action_type(action) else {
        return Vec::new();
    };
    match kind {
        "session/titleChanged" if model.is_own_channel(channel) => {
            make("title".into(), "title", str_of(action, "title").to_owned())
        }
        "chat/turnStarted" => {
            let message = &action["message"];
            let mut text = str_of(message, "text").to_owned();
            for label in message["attachments"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| str_of(a, "label"))
                .filter(|l| !l.is_empty())
            {
                text.push('\n');
                text.push_str(label);
            }
            make(format!("message:{channel}#{turn}"), "message", text)
        }
        "chat/responsePart" => {
            let part = &action["part"];
            match str_of(part, "kind") {
                "markdown" => answer(
                    format!("answer:{channel}#{turn}#{}", str_of(part, "id")),
                    str_of(part, "content"),
                    0,
                ),
                "toolCall" => {
                    let call = &part["toolCall"];
                    tool_doc(call, channel)
                        .map_or_else(Vec::new, |(key, text)| make(key, "tool", text))
                }
                _ => Vec::new(),
            }
        }
        "chat/delta" => {
            let part = str_of(action, "partId");
            let added = str_of(action, "content");
            let whole = model
                .chats
                .get(channel)
                .and_then(|chat| chat.active_turn.as_ref())
                .and_then(|active| {
                    active.response_parts.iter().find_map(|p| match p {
                        ahp_types::state::ResponsePart::Markdown(m) if m.id == part => {
                            Some(m.content.as_str())
                        }
                        _ => None,
                    })
                })
                .unwrap_or(added);
            answer(
                format!("answer:{channel}#{turn}#{part}"),
                whole,
                whole.len().saturating_sub(added.len()),
            )
        }
        "chat/toolCallStart" => {
            tool_doc(action, channel).map_or_else(Vec::new, |(key, text)| make(key, "tool", text))
        }
        "chat/toolCallComplete" => {
            let paths: Vec<&str> = action["result"]["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| str_of(c, "type") == "fileEdit")
                .filter_map(|c| {
                    c.pointer("/after/uri")
                        .or_else(|| c.pointer("/before/uri"))
                        .and_then(Value::as_str)
                })
                .map(|uri| uri.strip_prefix("file://").unwrap_or(uri))
                .collect();
            make(
                format!("edit:{channel}#{}", str_of(action, "toolCallId")),
                "edit",
                paths.join("\n"),
            )
        }
        "chat/inputRequested" => {
            let request = &action["request"];
            make(
                format!("question:{channel}#{}", str_of(request, "id")),
                "question",
                str_of(request, "message").to_owned(),
            )
        }
        _ => Vec::new(),
    }
}

/// A tool call's key and title (its display name, else its tool name, and
/// what it says it does).
fn tool_doc(call: &Value, channel: &str) -> Option<(String, String)> {
    let id = str_of(call, "toolCallId");
    if id.is_empty() {
        return None;
    }
    let name = [str_of(call, "displayName"), str_of(call, "toolName")]
        .into_iter()
        .find(|n| !n.is_empty())
        .unwrap_or_default();
    let mut text = name.to_owned();
    if let Some(said) = call.get("invocationMessage").and_then(|m| match m {
        Value::String(s) => Some(s.as_str()),
        other => other.get("markdown").and_then(Value::as_str),
    }) {
        text.push('\n');
        text.push_str(said);
    }
    Some((format!("tool:{channel}#{id}"), text))
}

/// The words of a text as both backends index them: runs of letters and
/// digits (any script), lower-cased; everything else separates.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// The text as Postgres indexes it: its [`words`], one space apart, so
/// both backends split it the same way (Postgres's own parser would keep
/// `src/main.rs` or an e-mail address as one token).
pub fn normalized(text: &str) -> String {
    words(text).collect::<Vec<_>>().join(" ")
}

/// One term of a query: a word, or a quoted phrase; either may end in a
/// prefix (`pars*` finds `parser`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// Its words, in order (one for a plain word).
    pub words: Vec<String>,
    /// Whether the last word is a prefix.
    pub prefix: bool,
}

/// Why a query cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// Nothing to search for.
    #[error("the query has no words to search for")]
    Empty,
    /// Too long.
    #[error("the query is longer than {MAX_QUERY_CHARS} characters")]
    TooLong,
    /// Too many terms.
    #[error("the query has more than {MAX_QUERY_TERMS} terms")]
    TooManyTerms,
}

/// A person's query: every term must match (words anywhere, phrases in
/// order); `"exact phrase"` quotes, `word*` is a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The terms, all required.
    pub terms: Vec<Term>,
}

impl Query {
    /// Reads a query. Characters that are neither letters nor digits only
    /// separate words, so no input can break the backend's query syntax.
    pub fn parse(q: &str) -> Result<Self, QueryError> {
        if q.chars().count() > MAX_QUERY_CHARS {
            return Err(QueryError::TooLong);
        }
        let mut terms = Vec::new();
        let mut rest = q;
        while let Some(start) = rest.find(|c: char| c == '"' || c.is_alphanumeric()) {
            rest = &rest[start..];
            let (body, after) = if let Some(quoted) = rest.strip_prefix('"') {
                match quoted.find('"') {
                    Some(end) => (&quoted[..end], &quoted[end + 1..]),
                    None => (quoted, ""),
                }
            } else {
                let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            };
            let prefix = after.starts_with('*') || body.ends_with('*');
            let words: Vec<String> = words(body).collect();
            let term = Term { words, prefix };
            // A term said twice asks nothing more (and would cost twice).
            if !term.words.is_empty() && !terms.contains(&term) {
                terms.push(term);
            }
            rest = after.trim_start_matches('*');
        }
        if terms.is_empty() {
            return Err(QueryError::Empty);
        }
        if terms.len() > MAX_QUERY_TERMS {
            return Err(QueryError::TooManyTerms);
        }
        Ok(Self { terms })
    }

    /// Each term in FTS5's syntax: each word a quoted string (so nothing
    /// in it is an operator), a phrase as an FTS5 phrase, a prefix with `*`.
    pub fn fts5_terms(&self) -> Vec<String> {
        self.terms
            .iter()
            .map(|t| {
                let phrase = t
                    .words
                    .iter()
                    .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
                    .collect::<Vec<_>>()
                    .join(" + ");
                if t.prefix {
                    format!("{phrase}*")
                } else {
                    phrase
                }
            })
            .collect()
    }

    /// The query in FTS5's syntax: every term ([`Query::fts5_terms`]).
    pub fn fts5(&self) -> String {
        self.fts5_terms().join(" AND ")
    }

    /// What matches any one of the query's terms, in FTS5's syntax.
    pub fn fts5_any(&self) -> String {
        self.fts5_terms().join(" OR ")
    }

    /// Each term as a Postgres `tsquery` text (for `to_tsquery('simple',
    /// …)`): each word a quoted lexeme, a phrase with `<->`, a prefix `:*`.
    pub fn tsquery_terms(&self) -> Vec<String> {
        self.terms
            .iter()
            .map(|t| {
                let last = t.words.len() - 1;
                let phrase = t
                    .words
                    .iter()
                    .enumerate()
                    .map(|(i, w)| {
                        let star = if t.prefix && i == last { ":*" } else { "" };
                        format!("'{}'{star}", w.replace('\'', "''").replace('\\', "\\\\"))
                    })
                    .collect::<Vec<_>>()
                    .join(" <-> ");
                format!("({phrase})")
            })
            .collect()
    }

    /// The query as a Postgres `tsquery` text: every term
    /// ([`Query::tsquery_terms`]).
    pub fn tsquery(&self) -> String {
        self.tsquery_terms().join(" & ")
    }

    /// What matches any one of the query's terms, as a `tsquery` text.
    pub fn tsquery_any(&self) -> String {
        self.tsquery_terms().join(" | ")
    }

    /// A short extract of `text` around the first word the query matches,
    /// about `width` characters, as pieces in order, each saying whether it
    /// is a matching word.
    pub fn snippet(&self, text: &str, width: usize) -> Vec<(String, bool)> {
        // Each word of the text with its byte range.
        let mut spans = Vec::new();
        let mut start = None;
        for (i, c) in text.char_indices().chain([(text.len(), ' ')]) {
            match (c.is_alphanumeric() && i < text.len(), start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    spans.push((s, i));
                    start = None;
                }
                _ => {}
            }
        }
        let hit = |word: &str| {
            let word = word.to_lowercase();
            self.terms.iter().any(|t| {
                t.words.iter().enumerate().any(|(i, w)| {
                    if t.prefix && i == t.words.len() - 1 {
                        word.starts_with(w.as_str())
                    } else {
                        word == *w
                    }
                })
            })
        };
        let first = spans
            .iter()
            .position(|&(s, e)| hit(&text[s..e]))
            .unwrap_or(0);
        // Start a few words before the first hit; end when wide enough.
        let from = first.saturating_sub(6);
        let mut out: Vec<(String, bool)> = Vec::new();
        let mut push = |piece: &str, matched: bool| match out.last_mut() {
            Some((last, false)) if !matched => last.push_str(piece),
            _ => out.push((piece.to_owned(), matched)),
        };
        let mut at = spans.get(from).map_or(0, |&(s, _)| s);
        if from > 0 {
            push("…", false);
        }
        let mut shown = 0;
        for &(s, e) in &spans[from..] {
            if shown >= width {
                push("…", false);
                return out;
            }
            // Line breaks and runs of blanks read as one space.
            let mut gap = String::new();
            for c in text[at..s].chars() {
                if !c.is_whitespace() {
                    gap.push(c);
                } else if !gap.ends_with(' ') {
                    gap.push(' ');
                }
            }
            push(&gap, false);
            let word = &text[s..e];
            push(word, hit(word));
            shown += gap.chars().count() + word.chars().count();
            at = e;
        }
        push(text[at..].trim_end(), false);
        out.retain(|(piece, _)| !piece.is_empty());
        out
    }
}

/// Snippet pieces as plain text.
pub fn plain(pieces: &[(String, bool)]) -> String {
    pieces.iter().map(|(p, _)| p.as_str()).collect()
}

/// Snippet pieces as HTML: the text escaped, each matching word in
/// `<mark>`.
pub fn html(pieces: &[(String, bool)]) -> String {
    let mut out = String::new();
    for (piece, matched) in pieces {
        if *matched {
            out.push_str("<mark>");
        }
        for c in piece.chars() {
            match c {
                '<' => out.push_str("&lt;"),
                '>' => out.push_str("&gt;"),
                '&' => out.push_str("&amp;"),
                '"' => out.push_str("&quot;"),
                '\'' => out.push_str("&#39;"),
                c => out.push(c),
            }
        }
        if *matched {
            out.push_str("</mark>");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::typed_action;

    /// A text of numbered words, some multi-byte, `bytes` long or a word more.
    fn prose(bytes: usize) -> String {
        let mut text = String::new();
        let mut n = 0;
        while text.len() < bytes {
            text.push_str(if n % 7 == 0 { "ünïcödé" } else { "word" });
            text.push_str(&n.to_string());
            text.push(if n % 11 == 0 { '\n' } else { ' ' });
            n += 1;
        }
        text
    }

    /// The words of the pieces, in order, are the text's words; every piece
    /// but the last is at least PIECE_BYTES and at most MAX_DOC_BYTES.
    fn check_pieces(text: &str) -> Vec<std::ops::Range<usize>> {
        let found = pieces(text);
        let words_of = |t: &str| words(t).collect::<Vec<_>>();
        let joined: Vec<String> = found
            .iter()
            .flat_map(|r| words_of(&text[r.clone()]))
            .collect();
        assert!(joined == words_of(text), "the pieces' words differ");
        for (n, r) in found.iter().enumerate() {
            assert!(r.len() <= MAX_DOC_BYTES, "{r:?}");
            if n + 1 < found.len() {
                assert!(r.len() >= PIECE_BYTES, "{r:?}");
                // A piece ends where a word does.
                assert!(!text[r.end..].starts_with(char::is_alphanumeric), "{r:?}");
            }
        }
        assert_eq!(found.last().unwrap().end, text.len());
        // Each piece's document reaches back at most PIECE_OVERLAP bytes,
        // into the piece before it only, from the start of a word.
        for pair in found.windows(2) {
            let lead = piece_lead(text, pair[1].start);
            assert!(lead > pair[0].start, "{pair:?}");
            assert!(pair[1].start - lead <= PIECE_OVERLAP, "{pair:?}");
            assert!(
                !text[..lead].ends_with(char::is_alphanumeric)
                    || !text[lead..].starts_with(char::is_alphanumeric),
                "{pair:?} leads from inside a word"
            );
        }
        found
    }

    #[test]
    fn an_answer_is_cut_where_words_end_and_its_ends_never_move() {
        assert_eq!(pieces(""), vec![std::ops::Range { start: 0, end: 0 }]);
        assert_eq!(
            pieces("short answer"),
            vec![std::ops::Range { start: 0, end: 12 }]
        );
        let text = prose(5 * PIECE_BYTES + 100);
        let whole = check_pieces(&text);
        assert!(whole.len() >= 5, "{whole:?}");
        // Grown a few bytes at a time (cut anywhere, inside words and
        // characters), every piece that has ended is as it will stay.
        let mut at = 0;
        let mut step = 1;
        while at < text.len() {
            at = text.ceil_char_boundary(at + step);
            step = step % 97 + 13;
            let now = check_pieces(&text[..at]);
            assert_eq!(now[..now.len() - 1], whole[..now.len() - 1], "at {at}");
        }
        // One word longer than a document: cut at the limit, on a
        // character's boundary.
        let word = format!("x{}", "é".repeat(MAX_DOC_BYTES / 2));
        assert_eq!(
            pieces(&word),
            [0..MAX_DOC_BYTES - 1, MAX_DOC_BYTES - 1..MAX_DOC_BYTES + 1]
        );
    }

    /// A streamed answer rewrites one piece a delta (two where it ends
    /// one), never more; the documents it wrote, latest per key, hold all
    /// of it, well past MAX_DOC_BYTES.
    #[test]
    fn a_streamed_answer_rewrites_only_the_pieces_a_delta_reaches() {
        let mut model = crate::model::test_model(&[]);
        let chat = "ahp-chat:/s.main";
        let mut apply = |action: Value| {
            model.apply(chat, &action, &typed_action(&action));
            doc(&model, chat, &action)
        };
        apply(json!({"type": "chat/turnStarted", "turnId": "t1",
            "startedAt": "2026-01-01T00:00:01.000Z",
            "message": {"text": "go", "origin": {"kind": "user"}}}));
        let text = prose(MAX_DOC_BYTES + 3 * PIECE_BYTES);
        let mut index = std::collections::BTreeMap::new();
        let mut at = text.ceil_char_boundary(10);
        let first = apply(json!({"type": "chat/responsePart", "turnId": "t1",
            "part": {"kind": "markdown", "id": "p1", "content": &text[..at]}}));
        for d in first {
            index.insert(d.key, d.text);
        }
        let mut most = 0;
        while at < text.len() {
            let end = text.ceil_char_boundary(at + 37);
            let docs = apply(json!({"type": "chat/delta", "turnId": "t1", "partId": "p1",
                "content": &text[at..end]}));
            assert!(
                !docs.is_empty() && docs.len() <= 2,
                "{} documents",
                docs.len()
            );
            most = most.max(docs.iter().map(|d| d.text.len()).max().unwrap());
            for d in docs {
                assert_eq!(d.kind, "answer");
                assert_eq!(d.turn_id.as_deref(), Some("t1"));
                index.insert(d.key, d.text);
            }
            at = end;
        }
        assert!(
            most < PIECE_BYTES + PIECE_OVERLAP + 64,
            "a delta rewrote {most} bytes"
        );
        let key = format!("answer:{chat}#t1#p1");
        assert!(
            index.contains_key(&key),
            "the first piece keeps the answer's key"
        );
        let mut pieces: Vec<(usize, &String)> = index
            .iter()
            .map(|(k, t)| match k.strip_prefix(&key) {
                Some("") => (0, t),
                Some(n) => (n.trim_start_matches('~').parse().unwrap(), t),
                None => panic!("{k}"),
            })
            .collect();
        pieces.sort();
        // Each document is its piece with the last words of the one before
        // (so a phrase across a piece's end is in one document), and the
        // pieces hold every word of the answer.
        let ranges = super::pieces(&text);
        assert_eq!(pieces.len(), ranges.len());
        for ((n, indexed), range) in pieces.iter().zip(&ranges) {
            assert_eq!(
                indexed.as_str(),
                &text[piece_lead(&text, range.start)..range.end],
                "piece {n}"
            );
            if *n > 0 {
                // Its words: the last few of the piece before, then its own.
                let before: Vec<String> = words(&text[ranges[n - 1].clone()]).collect();
                let own: Vec<String> = words(&text[range.clone()]).collect();
                let all: Vec<String> = words(indexed).collect();
                let lead = &all[..all.len() - own.len()];
                assert!(all.ends_with(&own), "piece {n}");
                assert!(
                    lead.len() >= 2 && before.ends_with(lead),
                    "piece {n} leads with {lead:?}"
                );
            }
        }
        let indexed: Vec<String> = ranges
            .iter()
            .flat_map(|r| words(&text[r.clone()]))
            .collect();
        assert_eq!(indexed, words(&text).collect::<Vec<_>>());
    }

    #[test]
    fn reads_words_phrases_and_prefixes() {
        let q = Query::parse(r#"  Deploy "main.rs file" pars* -- "#).unwrap();
        assert_eq!(q.terms.len(), 3);
        assert_eq!(q.terms[0].words, ["deploy"]);
        assert_eq!(q.terms[1].words, ["main", "rs", "file"]);
        assert!(!q.terms[1].prefix);
        assert_eq!(q.terms[2].words, ["pars"]);
        assert!(q.terms[2].prefix);
        assert_eq!(
            q.fts5(),
            r#""deploy" AND "main" + "rs" + "file" AND "pars"*"#
        );
        assert_eq!(
            q.tsquery(),
            "('deploy') & ('main' <-> 'rs' <-> 'file') & ('pars':*)"
        );
        assert_eq!(
            q.fts5_any(),
            r#""deploy" OR "main" + "rs" + "file" OR "pars"*"#
        );
        assert_eq!(
            q.tsquery_any(),
            "('deploy') | ('main' <-> 'rs' <-> 'file') | ('pars':*)"
        );
    }

    #[test]
    fn a_term_said_twice_is_one_term() {
        let q = Query::parse(r#"code Code "part of" code* "PART of" part"#).unwrap();
        let terms: Vec<(Vec<String>, bool)> =
            q.terms.into_iter().map(|t| (t.words, t.prefix)).collect();
        assert_eq!(
            terms,
            [
                (vec!["code".to_owned()], false),
                (vec!["part".to_owned(), "of".to_owned()], false),
                (vec!["code".to_owned()], true),
                (vec!["part".to_owned()], false),
            ]
        );
    }

    #[test]
    fn no_input_breaks_the_syntax() {
        for q in [
            r#"a"b"#,
            "NEAR(x y)",
            "x' OR 1=1 --",
            "\"",
            "* ^ :",
            "o'brien",
        ] {
            if let Ok(parsed) = Query::parse(q) {
                for t in &parsed.terms {
                    assert!(t.words.iter().all(|w| w.chars().all(char::is_alphanumeric)));
                }
            }
        }
        assert_eq!(Query::parse(" \" * "), Err(QueryError::Empty));
        assert_eq!(Query::parse(&"x".repeat(600)), Err(QueryError::TooLong));
        assert_eq!(
            Query::parse(&(0..20).map(|i| format!("w{i} ")).collect::<String>()),
            Err(QueryError::TooManyTerms)
        );
    }

    #[test]
    fn non_latin_words_are_words() {
        let q = Query::parse("Привет 世界").unwrap();
        assert_eq!(q.terms[0].words, ["привет"]);
        assert_eq!(normalized("Сказал: «Привет», мир!"), "сказал привет мир");
    }

    #[test]
    fn snippets_mark_the_hits() {
        let q = Query::parse("parser").unwrap();
        let text = "one two three four five six seven eight nine ten eleven the parser failed \
                    on line 4 and then some more words follow here";
        let s = html(&q.snippet(text, 40));
        assert!(s.starts_with('…'), "{s}");
        assert!(s.contains("the <mark>parser</mark> failed"), "{s}");
        assert!(s.ends_with('…'), "{s}");
        let q = Query::parse("ПРИВ*").unwrap();
        let pieces = q.snippet("Привет, <мир>\n\n  & co", 80);
        assert_eq!(plain(&pieces), "Привет, <мир> & co");
        assert_eq!(html(&pieces), "<mark>Привет</mark>, &lt;мир&gt; &amp; co");
    }
}
