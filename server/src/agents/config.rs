//! Agents as configuration: `--agent NAME=COMMAND` (repeatable) and
//! `TETHER_AGENTS` (entries separated by `;`).
//!
//! The command is split as a shell would split it (quotes, backslashes), but
//! no shell runs it. Leading `KEY=VALUE` words are the agent's own
//! environment, as in a shell: `claude=ANTHROPIC_API_KEY=… claude-code-acp`.

use std::fmt;

/// One configured agent's command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCommand {
    /// The provider name sessions are created with.
    pub name: String,
    /// The program: a path, or a name looked up on `PATH`.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment added to Tether's own for this agent.
    pub env: Vec<(String, String)>,
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
        let name = name.trim();
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
        let words = shell_words::split(command)
            .map_err(|e| format!("agent {name}: cannot split its command {command:?}: {e}"))?;
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

    /// The command as people read it, environment values hidden (they are
    /// often keys).
    pub fn display(&self) -> String {
        let mut words: Vec<String> = self.env.iter().map(|(k, _)| format!("{k}=…")).collect();
        words.push(self.program.clone());
        words.extend(self.args.iter().cloned());
        shell_words::join(words)
    }
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
    fn a_list_is_separated_by_semicolons() {
        let list = AgentCommand::parse_list("a=one; ;b=two --x;").expect("parses");
        let names: Vec<_> = list.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(list[1].args, ["--x"]);
    }
}
