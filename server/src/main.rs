//! The `tether` binary: parses the command line and hands over to the library.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tether_server::config::{Cli, Command, DatabaseArgs, ServeArgs, TokenArgs, hide_command_line};
use tether_server::{AppState, serve, store, telemetry};
use tokio::net::TcpListener;

/// mimalloc, not glibc's malloc: allocation and freeing across the runtime's
/// threads were a quarter of the server's CPU under load (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Read: the arguments (secrets among them, perhaps) are blanked where
    // other processes, agents included, could read them.
    let hidden = hide_command_line(2);
    let workers = match &cli.command {
        Command::Serve(args) => Some(args.runtime_workers()),
        _ => None,
    };
    let runtime = match runtime(workers) {
        Ok(runtime) => runtime,
        Err(err) => return fail(format!("cannot start the async runtime: {err}")),
    };
    match cli.command {
        Command::Serve(args) => runtime.block_on(run_serve(*args, hidden.err())),
        Command::Token(args) => run_token(&args),
        Command::Doctor(args) => runtime.block_on(tether_server::doctor::run(&args)),
        Command::Openapi => {
            print!("{}", tether_server::http::openapi_json());
            ExitCode::SUCCESS
        }
        Command::RebuildProjections(args) => runtime.block_on(run_rebuild(args)),
        Command::Backup(args) => {
            match runtime.block_on(store::backup(&args.database.database_url, &args.path)) {
                Ok(report) => {
                    print!("{report}");
                    ExitCode::SUCCESS
                }
                Err(err) => fail(err),
            }
        }
        Command::Migrate(args) => match runtime.block_on(tether_server::migrate::run(&args)) {
            Ok(summary) => {
                print!("{summary}");
                ExitCode::SUCCESS
            }
            Err(err) => fail(err.to_string()),
        },
        Command::McpStdio(args) => {
            match runtime.block_on(tether_server::agents::mcp_stdio::run(&args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => fail(err),
            }
        }
        Command::Remote(command) => runtime.block_on(tether_server::cli::run(command)),
    }
}

/// The async runtime, with `workers` worker threads (tokio's default, one
/// per core, when `None`).
fn runtime(workers: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    builder.build()
}

async fn run_rebuild(args: DatabaseArgs) -> ExitCode {
    let store = match store::open(&args.database_url, &args.store_options()).await {
        Ok(store) => store,
        Err(err) => return fail(err.to_string()),
    };
    let result = tether_server::engine::rebuild::rebuild_projections(store.as_ref()).await;
    store.close().await;
    match result {
        Ok(report) => {
            println!(
                "rebuilt {} session projections; {} read-model rows differed and were rewritten",
                report.sessions, report.changed
            );
            ExitCode::SUCCESS
        }
        Err(err) => fail(format!("rebuild failed: {err}")),
    }
}

/// Prints one line to stderr and returns a failing exit code.
fn fail(message: String) -> ExitCode {
    fail_with(message, ExitCode::FAILURE)
}

fn fail_with(message: String, code: ExitCode) -> ExitCode {
    eprintln!("tether: error: {message}");
    code
}

/// `tether token`: mints a token from the auth secret and prints only it
/// (exit code 2 when it cannot).
fn run_token(args: &TokenArgs) -> ExitCode {
    let fail = |message: String| fail_with(message, ExitCode::from(2));
    let secret = match tether_server::config::read_secret(
        args.auth_secret.as_ref(),
        args.auth_secret_file.as_ref(),
    ) {
        Ok(Some(secret)) => secret,
        Ok(None) => {
            return fail(
                "no secret: set TETHER_AUTH_SECRET or pass --auth-secret-file, as for tether serve"
                    .to_owned(),
            );
        }
        Err(err) => return fail(err.to_string()),
    };
    let minted = tether_server::auth::token::Authenticator::new(&secret)
        .and_then(|auth| auth.mint(&args.sub, args.role, &args.projects, args.ttl));
    match minted {
        Ok(token) => {
            println!("{token}");
            ExitCode::SUCCESS
        }
        Err(err) => fail(err.to_string()),
    }
}

async fn run_serve(args: ServeArgs, not_hidden: Option<std::io::Error>) -> ExitCode {
    telemetry::init(args.log_format);
    if let Some(err) = not_hidden {
        tracing::warn!(error = %err, "cannot hide the server's command line from other processes");
    }
    if let Err(err) = args.check_bind() {
        return fail(err.to_string());
    }
    // Not dumpable: this process's memory and environment (/proc/<pid>/
    // environ, mem) are closed to other processes of the same user, such
    // as an agent running unconfined, and it cannot be traced by them.
    if let Err(err) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        tracing::warn!(error = %err, "cannot make the server process non-dumpable");
    }
    let open_files = tether_server::doctor::raise_open_file_limit();
    // The configuration (the auth secret among it) is checked before the
    // store is opened: a weak secret is refused at once.
    let config = match args.serve_config() {
        Ok(config) => config,
        Err(err) => return fail(err.to_string()),
    };
    if !args.bind.ip().is_loopback() && !config.auth.enabled() {
        tracing::warn!(
            bind = %args.bind,
            "listening on a non-loopback address without authentication: anyone who can reach \
             this port can read and drive every session"
        );
    }
    let options = store::StoreOptions {
        host_id: args.host_id.clone(),
        // Half the lease (at least 2 s): the host row of a host cut off
        // mid-append is free again well before its leases run out.
        stalled_transaction: Some(
            (Duration::from_millis(args.lease_ttl_ms) / 2).max(Duration::from_secs(2)),
        ),
        ..args.database.store_options()
    };
    let store = match store::open(&args.database.database_url, &options).await {
        Ok(store) => store,
        Err(err) => return fail(err.to_string()),
    };
    let listener = match TcpListener::bind(args.bind).await {
        Ok(listener) => listener,
        Err(err) => {
            store.close().await;
            return fail(format!("cannot listen on {}: {err}", args.bind));
        }
    };
    let addr = listener
        .local_addr()
        .map_or_else(|_| args.bind.to_string(), |a| a.to_string());
    tracing::info!(
        %addr,
        backend = store.backend().as_str(),
        workers = tokio::runtime::Handle::current().metrics().num_workers(),
        database = %store::redact_url(&args.database.database_url),
        authentication = config.auth.enabled(),
        open_files = open_files.map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
        "tether is serving"
    );
    let state = match AppState::new(store.clone(), config).await {
        Ok(state) => state,
        Err(err) => {
            store.close().await;
            return fail(format!("cannot start the session engine: {err}"));
        }
    };
    match serve(listener, state, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => fail(format!("server failed: {err}")),
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (container stop).
async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
}
