//! The `wasmjob` binary: parses the command line and runs the chosen part of the platform.

use std::process::ExitCode;

use wasmjob::cli::{Command, UserCommand};
use wasmjob::config::{AdminConfig, BackupConfig, ExecutorConfig, NewUserConfig, StandaloneConfig};
use wasmjob::{admin, executor, telemetry};

/// jemalloc serves every allocation of the process, SQLite's too: under load, glibc's malloc
/// (fastbin consolidation, chunk unlinking) cost the admin about a fifth of its CPU. Its
/// settings are compiled in from `.cargo/config.toml`.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // Flags, environment and a daemon's config file; a mistake in them exits here (code 2).
    let command_line = match wasmjob::config::command_line(std::env::args_os()) {
        Ok(command_line) => command_line,
        Err(error) => error.exit(),
    };
    if let Some(settings) = &command_line.print_config {
        use std::io::Write;
        return match std::io::stdout().lock().write_all(settings.as_bytes()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    let cli = command_line.cli;
    telemetry::init(cli.log_format);
    if let Err(error) = wasmjob::failpoint::configure(&cli.failpoints) {
        tracing::error!("{error}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let command = match wasmjob::client_cli::ClientCommand::from_cli(cli.command) {
        Ok(client) => return runtime.block_on(wasmjob::client_cli::run(client)),
        Err(command) => *command,
    };
    match runtime.block_on(run(command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` prints the whole context chain on one line: "binding …: Address in use".
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Admin(args) => admin::run(AdminConfig::from_args(args)?).await,
        Command::Executor(args) => executor::run(ExecutorConfig::from_args(args)?).await,
        Command::Standalone(args) => standalone(StandaloneConfig::from_args(args)?).await,
        Command::User(UserCommand::Create(args)) => {
            admin::create_user_from_cli(NewUserConfig::from_args(args)?).await
        }
        Command::SetupBuilders(args) => {
            tokio::task::spawn_blocking(move || {
                admin::builders::setup(&args.dir, &args.python, &args.npm)?;
                tracing::info!(
                    "builders installed in {0}: start the admin with --builders-dir {0}",
                    args.dir.display()
                );
                anyhow::Ok(())
            })
            .await?
        }
        Command::Backup(args) => backup(BackupConfig::from_args(args)?).await,
        client => anyhow::bail!("{client:?} is a client command"),
    }
}

/// Copies a SQLite database, which a running admin may be writing, into a new file.
async fn backup(config: BackupConfig) -> anyhow::Result<()> {
    let (database, to) = (config.database.clone(), config.to.clone());
    let summary = tokio::task::spawn_blocking(move || {
        wasmjob::storage::backup::backup_sqlite(&database, &to)
    })
    .await??;
    tracing::info!(
        "backed up {} into {}: {} bytes, {} jobs, {} runs, integrity check ok",
        config.database.display(),
        config.to.display(),
        summary.bytes,
        summary.jobs,
        summary.runs
    );
    Ok(())
}

/// Admin and one executor in one process: the executor registers into the group `default`.
async fn standalone(config: StandaloneConfig) -> anyhow::Result<()> {
    let admin = admin::start(config.admin).await?;
    admin.state.db.ensure_group("default", "Default executors", admin::now_ms()).await?;
    let mut executor_config = config.executor;
    executor_config.admin_urls = vec![admin.url()];
    let executor = executor::start(executor_config).await?;
    for path in &config.token_files {
        tracing::info!("token kept in {}", path.display());
    }
    tracing::info!(
        "wasmjob standalone is up: operator API at {}/api/v1 (Authorization: Bearer $(cat {}))",
        admin.url(),
        config.token_files.first().map(|p| p.display().to_string()).unwrap_or_default()
    );
    if admin.state.db.count_users().await? == 0 {
        tracing::info!(
            "no console user yet: create the first administrator with \
             `wasmjob user create --admin --name NAME --database-url {}`, then sign in at {}/",
            admin.state.config.database_url,
            admin.url()
        );
    }
    telemetry::shutdown_signal().await;
    admin.stop_firing();
    executor.stop().await;
    admin.stop().await;
    Ok(())
}
