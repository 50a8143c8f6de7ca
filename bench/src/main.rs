//! `tether-load`: see the library crate and `BENCHMARKS.md`.

use std::io::Write as _;

use clap::Parser as _;
use tether_bench::cli::Cli;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let json = cli.common.json;
    let json_file = cli.common.json_file.clone();
    match tether_bench::run(cli).await {
        Ok(report) => {
            let line = serde_json::to_string(&report).unwrap_or_default();
            if json {
                println!("{line}");
            } else {
                print!("{}", report.human());
            }
            if let Some(path) = json_file {
                let appended = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .and_then(|mut file| writeln!(file, "{line}"));
                if let Err(err) = appended {
                    eprintln!("tether-load: cannot write {}: {err}", path.display());
                }
            }
            if report.ok() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::from(1)
            }
        }
        Err(err) => {
            eprintln!("tether-load: error: {err}");
            std::process::ExitCode::from(2)
        }
    }
}
