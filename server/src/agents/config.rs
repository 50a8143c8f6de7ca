//! Agents as configuration: `--agent NAME=COMMAND` (repeatable),
//! `TETHER_AGENTS` (entries separated by `;`), and the agents file
//! (`--agents-file`, TOML), which also gives an agent its environment,
//! env files and the paths its confinement lets it reach.
//!
//! A command line is split as a shell would split it (quotes, backslashes),
//! but no shell runs it. Leading `KEY=VALUE` words are the agent's own
//! environment, as in a shell: `claude=ANTHROPIC_API_KEY=… claude-code-acp`
//! (the agents file keeps such keys out of the server's own environment
//! and command line).
//!
//! ```toml
//! [agents.codex]
//! command = ["codex-acp"]            # or one string, split as a shell would
//! title = "Codex"                    # shown to people (default: what it reports)
//! env = { RUST_LOG = "warn" }        # its environment, besides the allow-list
//! env_files = ["/etc/tether/codex.env"]  # KEY=VALUE lines, read at each start
//! read = ["/opt/codex"]              # more it may read (and run)
//! write = ["/var/cache/codex"]       # more it may write
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// One configured agent's command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCommand {
    /// The provider name sessions are created with.
    pub name: String,
    /// The program: a path, or a name looked up on `PATH`.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its own environment (besides the allow-list the host passes on).
    pub env: Vec<(String, String)>,
    /// Files of `KEY=VALUE` lines added to its environment at each start.
    pub env_files: Vec<PathBuf>,
    /// Shown to people instead of what the agent reports.
    pub title: Option<String>,
    /// More paths it may read and run, besides the system's and its own.
    pub read: Vec<PathBuf>,
    /// More paths it may write, besides its session's directories and its
    /// scratch directory.
    pub write: Vec<PathBuf>,
}

impl AgentCommand {
    /// Parses `NAME=COMMAND`.
    pub fn parse(entry: &str) -> Result<Self, String> {
        let entry = entry.trim();
        let Some((name, command)) = entry.split_once('=') else {
            return Err(format!(
                "agent {entry:?} must be NAME=COMMAND, for example \
                 `--agent example=\"npx tsx agent.ts\"`"
            ));
        };
        let name = check_name(name.trim())?;
        let words = shell_words::split(command)
            .map_err(|e| format!("agent {name}: cannot split its command {command:?}: {e}"))?;
        Self::from_words(name, words)
    }

    /// An agent named `name` running `words` (leading `KEY=VALUE` words are
    /// its environment).
    fn from_words(name: &str, words: Vec<String>) -> Result<Self, String> {
        let mut env = Vec::new();
        let mut words = words.into_iter().peekable();
        while let Some(word) = words.peek() {
            match word.split_once('=') {
                Some((key, value)) if is_env_name(key) => {
                    env.push((key.to_owned(), value.to_owned()));
                    words.next();
                }
                _ => break,
            }
        }
        let Some(program) = words.next() else {
            return Err(format!("agent {name}: its command is empty"));
        };
        Ok(Self {
            name: name.to_owned(),
            program,
            args: words.collect(),
            env,
            env_files: Vec::new(),
            title: None,
            read: Vec::new(),
            write: Vec::new(),
        })
    }

    /// Parses a `TETHER_AGENTS` value: entries separated by `;` (empty
    /// entries are skipped).
    pub fn parse_list(list: &str) -> Result<Vec<Self>, String> {
        list.split(';')
            .filter(|entry| !entry.trim().is_empty())
            .map(Self::parse)
            .collect()
    }

    /// The agents of an agents file (TOML; see the module's doc), in name
    /// order.
    pub fn load_file(path: &Path) -> Result<Vec<Self>, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the agents file {}: {e}", path.display()))?;
        Self::parse_file(&text).map_err(|e| format!("agents file {}: {e}", path.display()))
    }

    /// The agents of an agents file's text.
    pub fn parse_file(text: &str) -> Result<Vec<Self>, String> {
        let file: AgentsFile = toml::from_str(text).map_err(|e| e.to_string())?;
        file.agents
            .into_iter()
            .map(|(name, entry)| {
                let name = check_name(&name)?;
                let words = match entry.command {
                    CommandSpec::Line(line) => shell_words::split(&line).map_err(|e| {
                        format!("agent {name}: cannot split its command {line:?}: {e}")
                    })?,
                    CommandSpec::Words(words) => words,
                };
                let mut agent = Self::from_words(name, words)?;
                for (key, value) in entry.env {
                    if !is_env_name(&key) {
                        return Err(format!(
                            "agent {name}: {key:?} is not an environment variable name"
                        ));
                    }
                    agent.env.push((key, value));
                }
                for (what, paths) in [
                    ("env_files", &entry.env_files),
                    ("read", &entry.read),
                    ("write", &entry.write),
                ] {
                    if let Some(relative) = paths.iter().find(|p| !p.is_absolute()) {
                        return Err(format!(
                            "agent {name}: {what} entry {} must be an absolute path",
                            relative.display()
                        ));
                    }
                }
                agent.env_files = entry.env_files;
                agent.read = entry.read;
                agent.write = entry.write;
                agent.title = entry.title.filter(|t| !t.trim().is_empty());
                Ok(agent)
            })
            .collect()
    }

    /// Its environment from its env files, read now: `KEY=VALUE` lines
    /// (`#` comments, blank lines and a leading `export ` are allowed;
    /// matching quotes around a value are removed).
    pub fn file_env(&self) -> Result<Vec<(String, String)>, String> {
        let mut env = Vec::new();
        for path in &self.env_files {
            let text = std::fs::read_to_string(path).map_err(|e| {
                format!(
                    "agent {}: cannot read its env file {}: {e}",
                    self.name,
                    path.display()
                )
            })?;
            for (number, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let line = line.strip_prefix("export ").unwrap_or(line);
                let parsed = line
                    .split_once('=')
                    .map(|(k, v)| (k.trim(), unquote(v.trim())))
                    .filter(|(k, _)| is_env_name(k));
                let Some((key, value)) = parsed else {
                    return Err(format!(
                        "agent {}: env file {} line {}: expected KEY=VALUE",
                        self.name,
                        path.display(),
                        number + 1
                    ));
                };
                env.push((key.to_owned(), value.to_owned()));
            }
        }
        Ok(env)
    }

    /// The command as people read it, environment values hidden (they are
    /// often keys).
    pub fn display(&self) -> String {
        let mut words: Vec<String> = self.env.iter().map(|(k, _)| format!("{k}=…")).collect();
        words.push(self.program.clone());
        words.extend(self.args.iter().cloned());
        shell_words::join(words)
    }
}

/// The agents file's shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentsFile {
    #[serde(default)]
    agents: BTreeMap<String, FileAgent>,
}

/// One `[agents.NAME]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAgent {
    command: CommandSpec,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    env_files: Vec<PathBuf>,
    #[serde(default)]
    read: Vec<PathBuf>,
    #[serde(default)]
    write: Vec<PathBuf>,
}

/// A command as one line or as its words.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum CommandSpec {
    Line(String),
    Words(Vec<String>),
}

fn unquote(value: &str) -> &str {
    for quote in ['"', '\''] {
        if let Some(inner) = value
            .strip_prefix(quote)
            .and_then(|v| v.strip_suffix(quote))
        {
            return inner;
        }
    }
    value
}

/// Checks an agent's name: the provider sessions are created with.
fn check_name(name: &str) -> Result<&str, String> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric());
    if !valid {
        return Err(format!(
            "agent name {name:?} must be 1 to 64 lower-case letters, digits, '-', '_' or \
                 '.', starting with a letter or digit"
        ));
    }
    if name == "echo" {
        return Err("agent name \"echo\" is the built-in agent's; choose another".to_owned());
    }
    Ok(name)
}

impl fmt::Display for AgentCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.display())
    }
}

fn is_env_name(key: &str) -> bool {
    !key.is_empty()
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !key.starts_with(|c: char| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_split_like_a_shell_would_and_leading_assignments_are_environment() {
        let agent = AgentCommand::parse(r#"demo=KEY=v1 "my agent" --flag 'two words' a\ b"#)
            .expect("parses");
        assert_eq!(agent.name, "demo");
        assert_eq!(agent.program, "my agent");
        assert_eq!(agent.args, ["--flag", "two words", "a b"]);
        assert_eq!(agent.env, [("KEY".to_owned(), "v1".to_owned())]);
        assert_eq!(
            agent.display(),
            "'KEY=…' 'my agent' --flag 'two words' 'a b'"
        );
    }

    #[test]
    fn bad_entries_are_refused_with_a_reason() {
        for (entry, needle) in [
            ("no-equals", "NAME=COMMAND"),
            ("=cmd", "agent name"),
            ("Big=cmd", "agent name"),
            ("echo=cmd", "built-in"),
            ("x=", "empty"),
            ("x=A=1", "empty"),
            ("x='unterminated", "cannot split"),
        ] {
            let err = AgentCommand::parse(entry).expect_err(entry);
            assert!(err.contains(needle), "{entry}: {err}");
        }
    }

    #[test]
    fn an_agents_file_names_commands_environment_and_paths() {
        let agents = AgentCommand::parse_file(
            r#"
            [agents.codex]
            command = ["codex-acp", "--flag"]
            title = "Codex"
            env = { CODEX_API_KEY = "k" }
            env_files = ["/etc/tether/codex.env"]
            read = ["/opt/codex"]
            write = ["/var/cache/codex"]

            [agents.claude]
            command = "LEVEL=2 claude-code-acp 'two words'"
            "#,
        )
        .expect("parses");
        assert_eq!(agents.len(), 2);
        let (claude, codex) = (&agents[0], &agents[1]);
        assert_eq!(claude.program, "claude-code-acp");
        assert_eq!(claude.args, ["two words"]);
        assert_eq!(claude.env, [("LEVEL".to_owned(), "2".to_owned())]);
        assert_eq!(codex.args, ["--flag"]);
        assert_eq!(codex.title.as_deref(), Some("Codex"));
        assert_eq!(codex.env, [("CODEX_API_KEY".to_owned(), "k".to_owned())]);
        assert_eq!(codex.read, [PathBuf::from("/opt/codex")]);
        assert_eq!(codex.write, [PathBuf::from("/var/cache/codex")]);
        for (text, needle) in [
            ("[agents.x]\ncommand = []", "empty"),
            ("[agents.x]\ncommand = \"a\"\nread = [\"rel\"]", "absolute"),
            ("[agents.x]\ncommand = \"a\"\nsecret = 1", "unknown field"),
            ("[agents.echo]\ncommand = \"a\"", "built-in"),
            (
                "[agents.x]\ncommand = \"a\"\nenv = { \"1A\" = \"v\" }",
                "not an environment",
            ),
        ] {
            let err = AgentCommand::parse_file(text).expect_err(text);
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn env_files_are_read_at_each_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.env");
        std::fs::write(&file, "# keys\nexport A=1\nB=\"two words\"\n\nC='x'\n").unwrap();
        let mut agent = AgentCommand::parse("a=prog").unwrap();
        agent.env_files = vec![file.clone()];
        let env = agent.file_env().unwrap();
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(pairs, [("A", "1"), ("B", "two words"), ("C", "x")]);
        std::fs::write(&file, "not a pair\n").unwrap();
        assert!(agent.file_env().unwrap_err().contains("line 1"));
    }

    #[test]
    fn a_list_is_separated_by_semicolons() {
        let list = AgentCommand::parse_list("a=one; ;b=two --x;").expect("parses");
        let names: Vec<_> = list.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(list[1].args, ["--x"]);
    }
}
