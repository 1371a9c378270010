//! Tests of `config`.

use super::*;

#[test]
fn tokens_are_checked() {
    let check = |token: Option<&str>| match check_token("--t", token.map(str::to_owned)) {
        Ok(token) => format!("ok {token}"),
        Err(error) => error.to_string(),
    };
    assert!(check(None).contains("is required"));
    assert!(check(Some("short")).contains("too short"));
    assert!(check(Some("default_token")).contains("too short"));
    // XXL-JOB's shipped token and an empty or blank one, as a migrating user might pass them.
    assert!(check(Some("")).contains("too short"));
    assert!(check(Some("                    ")).contains("too short"));
    assert!(check(Some("DEFAULT_TOKEN")).contains("too short"));
    assert!(check(Some("aaaaaaaaaaaaaaaaaaaa")).contains("well-known"));
    assert!(check(Some("1234567890123456")).contains("well-known"));
    assert_eq!(check(Some(" 9f8e7d6c5b4a39281706 ")), "ok 9f8e7d6c5b4a39281706");
}

/// Every well-known value passes the other rules (long enough, not one character repeated),
/// so listing it is what refuses it, in any case; an entry the length check already refuses
/// could never match.
#[test]
fn every_well_known_token_is_reachable() {
    for entry in WELL_KNOWN_TOKENS {
        let first = entry.chars().next();
        let repeated = entry.chars().all(|c| Some(c) == first);
        assert!(
            entry.trim().len() >= MIN_TOKEN_LEN && !repeated,
            "`{entry}` is refused by another rule: listing it is dead"
        );
        assert_eq!(entry.to_ascii_lowercase(), *entry, "`{entry}` is compared lowercased");
        for given in [entry.to_string(), entry.to_ascii_uppercase(), format!(" {entry} ")] {
            let refused = check_token("--t", Some(given.clone())).unwrap_err().to_string();
            assert!(refused.contains("well-known"), "`{given}`: {refused}");
        }
    }
}

#[test]
fn executor_limits_are_checked() {
    let limits = |queue: u32, queued_mb: u64, grace_secs: u64| {
        let args = LimitArgs {
            default_fuel: 1_000,
            default_memory_mb: 64,
            max_log_kb: 64,
            log_retention_days: 1,
            max_concurrent_runs: 4,
            max_queue_per_job: queue,
            max_queued_mb: queued_mb,
            shutdown_grace_secs: grace_secs,
        };
        match RunDefaults::from_args(&args) {
            Ok(defaults) => format!(
                "ok {} {} {:?}",
                defaults.max_queue_per_job, defaults.max_queued_bytes, defaults.shutdown_grace
            ),
            Err(error) => error.to_string(),
        }
    };
    assert_eq!(limits(1000, 256, 10), "ok 1000 268435456 10s");
    assert_eq!(limits(1, 1, 0), "ok 1 1048576 0ns");
    assert_eq!(limits(0, 256, 10), "--max-queue-per-job must be positive");
    assert_eq!(limits(10, 0, 10), "--max-queued-mb must be between 1 and 65536");
    assert_eq!(limits(10, 65_537, 10), "--max-queued-mb must be between 1 and 65536");
    assert_eq!(limits(10, 256, 3601), "--shutdown-grace-secs must be at most 3600");
}

#[test]
fn the_executor_allow_list_is_checked_at_start() {
    let list = |entries: &[&str]| entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>();
    assert!(executor_policy(&list(&["10.0.0.0/8", "*.jobs.internal"])).is_ok());
    let error = executor_policy(&list(&["10.0.0.0/8", "bad host"])).unwrap_err();
    assert_eq!(
        error.to_string(),
        "--executor-allow: `bad host` is neither a CIDR nor a host pattern (`name`, `*.domain` or `*`)"
    );
    let default = crate::netpolicy::DEFAULT_ALLOW.split(',').map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(executor_policy(&default).unwrap(), AddressPolicy::default());
}

#[test]
fn an_advertised_url_is_an_http_url_naming_a_host() {
    assert_eq!(advertise_url("http://admin-a:8080/".to_owned()).unwrap(), "http://admin-a:8080");
    assert_eq!(advertise_url("https://10.0.0.5".to_owned()).unwrap(), "https://10.0.0.5");
    let refused = |url: &str| advertise_url(url.to_owned()).unwrap_err().to_string();
    assert!(
        refused("admin-a:8080").starts_with("--advertise-url: use http"),
        "{}",
        refused("admin-a:8080")
    );
    assert!(refused("ftp://admin-a").starts_with("--advertise-url: use http"));
    assert!(refused("not a url").starts_with("--advertise-url: not a URL"));
}

#[test]
fn admin_urls_are_checked() {
    let table = [
        ("http://127.0.0.1:8080", "ok"),
        ("https://admin.internal:8443/", "ok"),
        ("http://admin.internal:8080/xxl-job-admin", "ok"),
        ("ftp://admin", "`ftp://admin` is not an http:// or https:// URL"),
        ("admin:8080", "`admin:8080` is not an http:// or https:// URL"),
        (
            "http://u:p@admin:8080",
            "`http://u:p@admin:8080`: an admin URL carries no user or password",
        ),
        (
            "http://admin:8080/?a=1",
            "`http://admin:8080/?a=1`: an admin URL has no query or fragment",
        ),
        ("http://", "`http://` is not a URL: empty host"),
    ];
    for (url, expected) in table {
        let actual =
            check_admin_url(url).map_or_else(|error| error.to_string(), |()| "ok".to_owned());
        assert_eq!(actual, expected, "{url}");
    }
}

#[test]
fn standalone_tokens_are_generated_once_and_private() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin-token");
    let first = stored_token(&path).unwrap();
    assert_eq!(first.len(), 64);
    assert_eq!(stored_token(&path).unwrap(), first);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}

#[test]
fn an_executor_address_is_a_url_or_with_pull_a_pull_address() {
    let executor = |extra: &[&str]| {
        let mut argv = vec!["wasmjob", "executor", "--admin-url", "http://127.0.0.1:8080"];
        argv.extend(["--app-name", "default", "--access-token", "k7Qx2Lw9Zp4Rt8Vm"]);
        argv.extend(extra);
        let crate::cli::Command::Executor(args) =
            <crate::cli::Cli as clap::Parser>::try_parse_from(argv).unwrap().command
        else {
            unreachable!("parsed as an executor")
        };
        match ExecutorConfig::from_args(args) {
            Ok(config) => format!("ok {:?} {}", config.address, config.pull),
            Err(error) => error.to_string(),
        }
    };
    let table: [(&[&str], &str); 5] = [
        (&["--address", "http://10.0.0.5:9999"], r#"ok Some("http://10.0.0.5:9999") false"#),
        (&["--pull"], "ok None true"),
        (&["--pull", "--address", "pull://worker-1"], r#"ok Some("pull://worker-1") true"#),
        (
            &["--pull", "--address", "http://10.0.0.5:9999"],
            "--address `http://10.0.0.5:9999` is not a pull address",
        ),
        (
            &["--address", "pull://worker-1"],
            "--address `pull://worker-1`: only http and https are accepted",
        ),
    ];
    for (extra, expected) in table {
        assert_eq!(executor(extra), expected, "{extra:?}");
    }
}
