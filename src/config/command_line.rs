//! The command line as the daemons see it: a flag, else its environment twin, else the
//! configuration file's key, else the built-in default; secrets read from their `_file`s; and
//! `--print-config`.
//!
//! clap reads the flags and the environment (the only reader of the environment, with
//! `config`). The file is found by a first, forgiving parse (`--config` or `WASMJOB_CONFIG`);
//! its values then become the flags' defaults, so the real parse applies the precedence itself.
//! Errors come back as clap errors: one `error: …` line on stderr and exit code 2, before any
//! logging is set up.
//!
//! The values are not checked here beyond their types: `config`'s `from_args` does that.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};

use super::file::{ConfigFile, Key, Kind, keys};
use crate::cli::{Cli, Command};

/// The command line, with a daemon's configuration file applied and its secrets read.
#[derive(Debug)]
pub struct CommandLine {
    /// What to run, with every setting in place.
    pub cli: Cli,
    /// With `--print-config`: the effective settings as TOML, secrets redacted.
    pub print_config: Option<String>,
}

/// The subcommands that take `--config`.
const DAEMONS: &[&str] = &["standalone", "admin", "executor"];

/// The secrets, each with its `_file` twin: both are keys, flags and environment variables.
const SECRETS: &[(&str, &str)] = &[
    ("admin_token", "admin_token_file"),
    ("access_token", "access_token_file"),
    ("database_url", "database_url_file"),
    ("smtp_url", "smtp_url_file"),
];

/// What a redacted secret reads as in `--print-config`.
pub const REDACTED: &str = "<redacted>";

/// Parses `argv` (the program name first) with the environment and a daemon's configuration
/// file; `--help`, `--version` and every mistake come back as the clap error to exit with.
pub fn command_line(
    argv: impl IntoIterator<Item = impl Into<OsString>>,
) -> Result<CommandLine, clap::Error> {
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let file = config_file(&argv)?;
    let mut command = Cli::command();
    if let Some((name, file)) = &file {
        command = file.apply(command, name);
    }
    let matches = command.try_get_matches_from_mut(argv)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    let Some((name, matches)) = matches.subcommand().filter(|(name, _)| DAEMONS.contains(name))
    else {
        return Ok(CommandLine { cli, print_config: None });
    };
    let file = file.map(|(_, file)| file);
    let settings = Settings { matches, file: file.as_ref() };
    read_secrets(&mut cli.command, &settings).map_err(usage_error)?;
    let print_config = print_config_requested(&cli.command).then(|| settings.render(name));
    Ok(CommandLine { cli, print_config })
}

/// The subcommand and configuration file named by `argv` or `WASMJOB_CONFIG`, read and checked.
///
/// A first parse that forgives every error finds them; whatever it forgave, the real parse
/// reports.
fn config_file(argv: &[OsString]) -> Result<Option<(String, ConfigFile)>, clap::Error> {
    let root = Cli::command();
    let Ok(matches) = root.clone().ignore_errors(true).try_get_matches_from(argv) else {
        return Ok(None);
    };
    let Some((name, matches)) = matches.subcommand().filter(|(name, _)| DAEMONS.contains(name))
    else {
        return Ok(None);
    };
    let Some(path) = matches.try_get_one::<PathBuf>("config").ok().flatten() else {
        return Ok(None);
    };
    let Some(subcommand) = root.find_subcommand(name) else { return Ok(None) };
    let file = ConfigFile::load(path, &root, subcommand)
        .map_err(|error| usage_error(error.to_string()))?;
    Ok(Some((name.to_owned(), file)))
}

fn usage_error(message: String) -> clap::Error {
    clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{message}\n"))
}

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Flag,
    Environment,
    File,
    Default,
}

/// A daemon's parsed flags and its configuration file: where each value came from.
struct Settings<'a> {
    matches: &'a ArgMatches,
    file: Option<&'a ConfigFile>,
}

impl Settings<'_> {
    /// Where the flag `id`'s value came from; `None` when it has none.
    fn source(&self, id: &str) -> Option<Source> {
        // Asking clap about an id it does not know panics in debug builds.
        self.matches.try_get_raw(id).ok()?;
        Some(match self.matches.value_source(id)? {
            ValueSource::CommandLine => Source::Flag,
            ValueSource::EnvVariable => Source::Environment,
            _ if self.file.is_some_and(|file| file.sets(id)) => Source::File,
            _ => Source::Default,
        })
    }

    /// Whether the flag `id` was given, by any means but its built-in default.
    fn given(&self, id: &str) -> bool {
        self.source(id).is_some_and(|source| source != Source::Default)
    }

    fn raw(&self, id: &str) -> Option<Vec<String>> {
        let values = self.matches.try_get_raw(id).ok().flatten()?;
        Some(values.map(|value| value.to_string_lossy().into_owned()).collect())
    }

    /// The effective settings of the daemon `name` as TOML, one key a line with where its value
    /// came from; secrets are redacted and unset keys commented out.
    fn render(&self, name: &str) -> String {
        let root = Cli::command();
        let Some(subcommand) = root.find_subcommand(name) else { return String::new() };
        let mut out = format!(
            "# wasmjob {name}: the effective settings (flag > environment > config file > \
             default), secrets redacted\n"
        );
        if let Some(file) = self.file {
            out.push_str(&format!("# config file: {}\n", file.path.display()));
        }
        for key in keys(&root, subcommand) {
            let secret_file = SECRETS
                .iter()
                .find(|(secret, _)| *secret == key.name)
                .map(|(_, file)| *file)
                .filter(|file| self.given(file));
            let line = match (secret_file, self.raw(&key.id)) {
                (Some(file), _) => format!("{} = \"{REDACTED}\" # from {file}", key.name),
                (None, None) => format!("# {} is not set", key.name),
                (None, Some(values)) => {
                    let secret = SECRETS.iter().any(|(secret, _)| *secret == key.name);
                    let value =
                        if secret { format!("\"{REDACTED}\"") } else { toml_value(&key, &values) };
                    let source = match self.source(&key.id) {
                        Some(Source::Flag) => "flag".to_owned(),
                        Some(Source::Environment) => {
                            env_name(subcommand, &root, &key.id).unwrap_or_default()
                        }
                        Some(Source::File) => "config file".to_owned(),
                        Some(Source::Default) | None => "default".to_owned(),
                    };
                    format!("{} = {value} # {source}", key.name)
                }
            };
            out.push_str(&line);
            out.push('\n');
        }
        out
    }
}

/// The environment variable of the flag `id`.
fn env_name(subcommand: &clap::Command, root: &clap::Command, id: &str) -> Option<String> {
    let arg = subcommand.get_arguments().chain(root.get_arguments()).find(|arg| arg.get_id() == id);
    Some(arg?.get_env()?.to_string_lossy().into_owned())
}

/// `values` as a TOML value of `key`'s type.
fn toml_value(key: &Key, values: &[String]) -> String {
    let one = |value: &String| match key.kind {
        Kind::String => toml_string(value),
        // From the environment, `030` or `+30` parse as 30 but are no TOML integers.
        Kind::Integer => {
            value.parse::<i128>().map_or_else(|_| toml_string(value), |n| n.to_string())
        }
        Kind::Boolean => value.clone(),
    };
    if key.list {
        format!("[{}]", values.iter().map(one).collect::<Vec<_>>().join(", "))
    } else {
        values.first().map(one).unwrap_or_default()
    }
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Replaces each secret given by its `_file` with the file's content.
fn read_secrets(command: &mut Command, settings: &Settings<'_>) -> Result<(), String> {
    match command {
        Command::Admin(args) => {
            let mut database_url = None;
            read_secret(settings, "database_url", &mut database_url, &args.database_url_file)?;
            if let Some(url) = database_url {
                args.database_url = url;
            }
            read_secret(settings, "admin_token", &mut args.admin_token, &args.admin_token_file)?;
            read_secret(settings, "access_token", &mut args.access_token, &args.access_token_file)?;
            let alarms = &mut args.alarms;
            read_secret(settings, "smtp_url", &mut alarms.smtp_url, &alarms.smtp_url_file)?;
        }
        Command::Executor(args) => {
            read_secret(settings, "access_token", &mut args.access_token, &args.access_token_file)?;
        }
        Command::Standalone(args) => {
            read_secret(settings, "admin_token", &mut args.admin_token, &args.admin_token_file)?;
            read_secret(settings, "access_token", &mut args.access_token, &args.access_token_file)?;
            let alarms = &mut args.alarms;
            read_secret(settings, "smtp_url", &mut alarms.smtp_url, &alarms.smtp_url_file)?;
        }
        _ => {}
    }
    Ok(())
}

/// Sets `value` to the content of `file`, when given, but not when `key` is given too.
fn read_secret(
    settings: &Settings<'_>,
    key: &str,
    value: &mut Option<String>,
    file: &Option<PathBuf>,
) -> Result<(), String> {
    let Some(path) = file else { return Ok(()) };
    if settings.given(key) {
        return Err(format!("give {key} or {key}_file, not both"));
    }
    *value = Some(secret_from_file(key, path)?);
    Ok(())
}

/// The content of the secret file `path`, its trailing newline trimmed.
fn secret_from_file(key: &str, path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("{key}_file {}: {error}", path.display()))?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(format!("{key}_file {} is empty", path.display()));
    }
    Ok(secret.to_owned())
}

fn print_config_requested(command: &Command) -> bool {
    match command {
        Command::Admin(args) => args.config.print_config,
        Command::Executor(args) => args.config.print_config,
        Command::Standalone(args) => args.config.print_config,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    /// Parses `wasmjob <args>` with `config` written to a file named by `--config` (`{dir}` in
    /// `config` and `args` is a temporary directory); the lines of `--print-config` for `keys`,
    /// or the error.
    fn settings(args: &[&str], config: Option<&str>, keys: &[&str]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let dir_text = dir.path().display().to_string();
        std::fs::write(dir.path().join("token"), "0123456789abcdef0123\n").unwrap();
        std::fs::write(dir.path().join("empty"), "\n").unwrap();
        let mut argv: Vec<String> =
            ["wasmjob"].iter().chain(args).map(|arg| arg.replace("{dir}", &dir_text)).collect();
        if let Some(config) = config {
            let path = dir.path().join("wasmjob.toml");
            std::fs::write(&path, config.replace("{dir}", &dir_text)).unwrap();
            argv.extend(["--config".to_owned(), path.display().to_string()]);
        }
        argv.push("--print-config".to_owned());
        let command_line = match command_line(argv) {
            Ok(command_line) => command_line,
            Err(error) => return error.to_string().trim().replace(&dir_text, "{dir}"),
        };
        let printed = command_line.print_config.unwrap();
        printed
            .lines()
            .filter(|line| keys.iter().any(|key| line.starts_with(&format!("{key} = "))))
            .collect::<Vec<_>>()
            .join("\n")
            .replace(&dir_text, "{dir}")
    }

    #[test]
    fn a_flag_wins_over_the_file_which_wins_over_the_default() {
        let keys = ["listen", "heartbeat_secs", "run_retention_days", "executor_allow"];
        expect![[r#"
            listen = "0.0.0.0:8080" # default
            heartbeat_secs = 30 # default
            run_retention_days = 30 # default
            executor_allow = ["127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "localhost"] # default"#]]
        .assert_eq(&settings(&["admin"], None, &keys));
        let file = "listen = \"127.0.0.1:9000\"\nheartbeat_secs = 10\nexecutor_allow = [\"10.1.0.0/16\"]\n";
        expect![[r#"
            listen = "127.0.0.1:9000" # config file
            heartbeat_secs = 10 # config file
            run_retention_days = 30 # default
            executor_allow = ["10.1.0.0/16"] # config file"#]]
        .assert_eq(&settings(&["admin"], Some(file), &keys));
        expect![[r#"
            listen = "127.0.0.1:9000" # config file
            heartbeat_secs = 20 # flag
            run_retention_days = 7 # flag
            executor_allow = ["10.2.0.0/16", "10.3.0.0/16"] # flag"#]]
        .assert_eq(&settings(
            &[
                "admin",
                "--heartbeat-secs",
                "20",
                "--run-retention-days",
                "7",
                "--executor-allow",
                "10.2.0.0/16,10.3.0.0/16",
            ],
            Some(file),
            &keys,
        ));
        // A required flag given by the file; the global --log-format as a key.
        let file = "admin_url = [\"http://a:8080\", \"http://b:8080\"]\napp_name = \"billing\"\nlog_format = \"json\"\n";
        expect![[r#"
            admin_url = ["http://a:8080", "http://b:8080"] # config file
            app_name = "billing" # config file
            log_format = "json" # config file"#]]
        .assert_eq(&settings(&["executor"], Some(file), &["admin_url", "app_name", "log_format"]));
        expect![[r#"log_format = "text" # flag"#]].assert_eq(&settings(
            &["executor", "--log-format", "text"],
            Some(file),
            &["log_format"],
        ));
        expect!["error: the following required arguments were not provided:\n  --admin-url <ADMIN_URL>\n  --app-name <APP_NAME>\n\nUsage: wasmjob executor --admin-url <ADMIN_URL> --app-name <APP_NAME> --print-config\n\nFor more information, try '--help'."]
        .assert_eq(&settings(&["executor"], None, &["log_format"]));
    }

    #[test]
    fn the_callback_apply_time_is_read_and_bounded() {
        let keys = ["callback_apply_ms"];
        assert_eq!(settings(&["admin"], None, &keys), "callback_apply_ms = 100 # default");
        let file = "callback_apply_ms = 0\n";
        assert_eq!(settings(&["admin"], Some(file), &keys), "callback_apply_ms = 0 # config file");
        let refused = settings(&["standalone", "--callback-apply-ms", "501"], None, &keys);
        assert!(
            refused.starts_with("error: invalid value '501' for '--callback-apply-ms <CALLBACK_APPLY_MS>': 501 is not in 0..=500"),
            "{refused}"
        );
    }

    #[test]
    fn secrets_come_from_their_files_once_and_are_redacted() {
        let keys = ["admin_token", "admin_token_file", "access_token", "database_url", "smtp_url"];
        expect![[r#"
            database_url = "<redacted>" # from database_url_file
            admin_token = "<redacted>" # from admin_token_file
            admin_token_file = "{dir}/token" # flag
            access_token = "<redacted>" # flag"#]]
        .assert_eq(&settings(
            &[
                "admin",
                "--admin-token-file",
                "{dir}/token",
                "--access-token",
                "fedcba9876543210fedc",
                "--database-url-file",
                "{dir}/token",
            ],
            None,
            &keys,
        ));
        expect![[r#"
            database_url = "<redacted>" # default
            admin_token = "<redacted>" # config file
            smtp_url = "<redacted>" # from smtp_url_file"#]]
        .assert_eq(&settings(
            &["admin"],
            Some("admin_token = \"0123456789abcdef0123\"\nsmtp_url_file = \"{dir}/token\"\nsmtp_from = \"a@b.c\""),
            &keys,
        ));
        expect!["error: give admin_token or admin_token_file, not both"].assert_eq(&settings(
            &["admin", "--admin-token-file", "{dir}/token"],
            Some("admin_token = \"0123456789abcdef0123\""),
            &keys,
        ));
        expect!["error: give database_url or database_url_file, not both"].assert_eq(&settings(
            &["admin", "--database-url", "sqlite:x.db"],
            Some("database_url_file = \"{dir}/token\""),
            &keys,
        ));
        expect!["error: access_token_file {dir}/missing: No such file or directory (os error 2)"]
            .assert_eq(&settings(
                &[
                    "executor",
                    "--admin-url",
                    "http://a:1",
                    "--app-name",
                    "a",
                    "--access-token-file",
                    "{dir}/missing",
                ],
                None,
                &keys,
            ));
        expect!["error: admin_token_file {dir}/empty is empty"].assert_eq(&settings(
            &["standalone", "--admin-token-file", "{dir}/empty"],
            None,
            &keys,
        ));
    }

    #[test]
    fn secrets_read_from_files_reach_the_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "0123456789abcdef0123\r\n").unwrap();
        let url = dir.path().join("url");
        std::fs::write(&url, "postgres://wasmjob:secret@db/wasmjob\n").unwrap();
        let argv = [
            "wasmjob",
            "admin",
            "--admin-token-file",
            token.to_str().unwrap(),
            "--database-url-file",
            url.to_str().unwrap(),
        ];
        let command_line = command_line(argv).unwrap();
        assert!(command_line.print_config.is_none());
        let Command::Admin(args) = command_line.cli.command else { panic!("not admin") };
        assert_eq!(args.admin_token.as_deref(), Some("0123456789abcdef0123"));
        assert_eq!(args.database_url, "postgres://wasmjob:secret@db/wasmjob");
    }

    #[test]
    fn print_config_is_toml_that_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("wasmjob.toml");
        std::fs::write(&config, "executor_allow = [\"a\\\"b\"]\nmax_unfinished_runs = 5\n")
            .unwrap();
        let argv = ["wasmjob", "admin", "--config", config.to_str().unwrap(), "--print-config"];
        let printed = command_line(argv).unwrap().print_config.unwrap();
        let table: toml::Table = toml::from_str(&printed).unwrap();
        assert_eq!(table["max_unfinished_runs"].as_integer(), Some(5));
        assert_eq!(table["executor_allow"].as_array().unwrap()[0].as_str(), Some("a\"b"));
        assert!(table.get("admin_token").is_none(), "{printed}");
        // Printed back into a file, the settings are the same.
        std::fs::write(&config, &printed).unwrap();
        let again = command_line(argv).unwrap().print_config.unwrap();
        let strip = |text: &str| {
            text.lines()
                .map(|line| line.split(" # ").next().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(strip(&again), strip(&printed));
    }
}
