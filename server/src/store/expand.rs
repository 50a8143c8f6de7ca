//! The upgrade rule for migrations (README, "Backups and upgrades"): a
//! release's migrations only *expand* the schema, so hosts of the previous
//! release keep working on it during a rolling upgrade; what they would
//! trip on (a table or column gone or renamed, a type changed, a new
//! required column they do not fill) waits for a later release, in a file
//! named `*_contract.sql`, once no host of the old release is left.

/// Why `sql` would break a host of the previous release, if it would.
pub fn contraction(sql: &str) -> Option<String> {
    // Comments out, one statement per item, whitespace and case folded.
    let text: String = sql
        .lines()
        .map(|line| line.split("--").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ");
    for statement in text.split(';') {
        let statement = statement
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_uppercase();
        let breaking = [
            ("DROP TABLE", "drops a table"),
            ("DROP COLUMN", "drops a column"),
            ("RENAME", "renames something"),
            ("SET NOT NULL", "makes a column required"),
            (" TYPE ", "changes a column's type"),
        ];
        for (words, what) in breaking {
            let applies = statement.starts_with("ALTER TABLE") || words == "DROP TABLE";
            if applies && statement.contains(words) {
                return Some(format!("{what}: {statement}"));
            }
        }
        if statement.contains("ADD COLUMN")
            && statement.contains("NOT NULL")
            && !statement.contains("DEFAULT")
        {
            return Some(format!(
                "adds a required column without a default (older hosts do not fill it): \
                 {statement}"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::contraction;

    /// The last migration of each backend in the release this rule started
    /// with; every later one must only expand.
    const SINCE: [(&str, u32); 2] = [("postgres", 15), ("sqlite", 12)];

    #[test]
    fn flags_what_older_hosts_would_trip_on() {
        for sql in [
            "DROP TABLE usage;",
            "ALTER TABLE log DROP COLUMN origin_scope;",
            "alter table log rename column a to b;",
            "ALTER TABLE log ALTER COLUMN seq TYPE TEXT;",
            "ALTER TABLE log ALTER COLUMN a SET NOT NULL;",
            "ALTER TABLE log ADD COLUMN x TEXT NOT NULL;",
        ] {
            assert!(contraction(sql).is_some(), "{sql}");
        }
        for sql in [
            "CREATE TABLE t (a TEXT NOT NULL);",
            "ALTER TABLE log ADD COLUMN origin_scope TEXT NOT NULL DEFAULT ''; -- DROP TABLE x",
            "CREATE INDEX log_by_type ON log (type);",
            "DROP INDEX IF EXISTS old_index;",
        ] {
            assert_eq!(contraction(sql), None, "{sql}");
        }
    }

    #[test]
    fn migrations_after_the_rule_began_only_expand() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations");
        let mut checked = 0;
        for (backend, since) in SINCE {
            let dir = std::path::Path::new(root).join(backend);
            for entry in std::fs::read_dir(&dir).expect("the migrations folder") {
                let path = entry.expect("an entry").path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let number: u32 = name[..4].parse().expect("a numbered migration");
                if number <= since || name.ends_with("_contract.sql") {
                    continue;
                }
                let sql = std::fs::read_to_string(&path).expect("a migration");
                if let Some(why) = contraction(&sql) {
                    panic!(
                        "{backend}/{name} {why}; hosts of the previous release break on it \
                         during a rolling upgrade: expand now, contract in a later release \
                         (a file named *_contract.sql)"
                    );
                }
                checked += 1;
            }
        }
        eprintln!("{checked} migrations after the rule began, all expanding");
    }
}
