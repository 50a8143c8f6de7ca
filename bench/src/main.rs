//! `tether-load`: see the library crate and `BENCHMARKS.md`.

use clap::Parser as _;
use tether_bench::cli::Cli;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let json = cli.common.json;
    match tether_bench::run(cli).await {
        Ok(report) => {
            if json {
                match serde_json::to_string(&report) {
                    Ok(line) => println!("{line}"),
                    Err(err) => eprintln!("tether-load: error: {err}"),
                }
            } else {
                print!("{}", report.human());
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
