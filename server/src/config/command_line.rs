//! The server's own command line, hidden once it is read.
//!
//! Any process on the machine can read another's arguments
//! (`/proc/<pid>/cmdline` is open to all, a non-dumpable process's
//! included), and flags can carry secrets: `--auth-secret`, a database URL
//! with its password, an agent's `KEY=VALUE` words. Agents run beside the
//! server, so after parsing the server blanks its arguments past the
//! program and the subcommand in its own memory (through `/proc/self/mem`:
//! the area the kernel reads `cmdline` from). `ps` then shows
//! `tether serve`; the start line logs what the server runs with, redacted.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;

/// Blanks the process's arguments after the first `keep` (the program and
/// its subcommand).
pub fn hide_command_line(keep: usize) -> io::Result<()> {
    let (start, end) = argument_area(&std::fs::read_to_string("/proc/self/stat")?)?;
    let mem = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")?;
    let mut area = vec![0; usize::try_from(end.saturating_sub(start)).map_err(invalid)?];
    mem.read_exact_at(&mut area, start)?;
    let kept = kept_bytes(&area, keep);
    if area[kept..].iter().all(|&b| b == 0) {
        return Ok(());
    }
    mem.write_all_at(&vec![0; area.len() - kept], start + kept as u64)
}

/// Where the arguments are (`arg_start` and `arg_end`, fields 48 and 49 of
/// `/proc/self/stat`; the name in field 2 may hold spaces and parentheses,
/// so fields are counted from its closing one).
fn argument_area(stat: &str) -> io::Result<(u64, u64)> {
    let rest = stat
        .rfind(')')
        .map(|at| &stat[at + 1..])
        .ok_or_else(|| invalid("no process name"))?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // `rest` begins at field 3.
    let field = |n: usize| -> io::Result<u64> {
        fields
            .get(n - 3)
            .ok_or_else(|| invalid("too few fields"))?
            .parse()
            .map_err(invalid)
    };
    let (start, end) = (field(48)?, field(49)?);
    if start == 0 || end < start {
        return Err(invalid("no argument area"));
    }
    Ok((start, end))
}

/// The length of the first `keep` NUL-terminated arguments in `area`.
fn kept_bytes(area: &[u8], keep: usize) -> usize {
    let mut at = 0;
    for _ in 0..keep {
        match area[at..].iter().position(|&b| b == 0) {
            Some(nul) => at += nul + 1,
            None => return area.len(),
        }
    }
    at
}

fn invalid(err: impl ToString) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_area_is_read_past_a_name_with_spaces_and_parentheses() {
        let mut stat = "4242 (tether (x) y) S".to_owned();
        for n in 4..=52 {
            stat.push_str(&format!(" {n}"));
        }
        assert_eq!(argument_area(&stat).unwrap(), (48, 49));
        assert!(argument_area("4242 (t) S 1 2").is_err());
    }

    #[test]
    fn the_program_and_subcommand_are_kept() {
        let area = b"tether\0serve\0--auth-secret\0s3cret\0";
        assert_eq!(kept_bytes(area, 2), 13);
        assert_eq!(kept_bytes(area, 0), 0);
        assert_eq!(kept_bytes(b"tether", 2), 6);
    }
}
