//! The checks of single settings: URLs, names and bounds, each refused with the flag it came
//! from and what to use instead.

use std::time::Duration;

/// Checks `--advertise-url`: an http or https URL naming a host, kept without a trailing `/`.
pub(super) fn advertise_url(url: String) -> anyhow::Result<String> {
    let parsed = url::Url::parse(&url)
        .map_err(|error| anyhow::anyhow!("--advertise-url: not a URL ({error}): {url}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        anyhow::bail!("--advertise-url: use http://host[:port] or https://host[:port], not {url}");
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// Reads `--max-unfinished-runs` (0: no bound).
pub(super) fn max_unfinished(limit: u64) -> Option<u64> {
    (limit > 0).then_some(limit)
}

/// An admin base URL: http or https, a host, perhaps a path (an admin behind a context path),
/// and nothing that would send the token somewhere unexpected (userinfo, query, fragment).
pub(super) fn check_admin_url(text: &str) -> anyhow::Result<()> {
    let url =
        url::Url::parse(text).map_err(|error| anyhow::anyhow!("`{text}` is not a URL: {error}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        anyhow::bail!("`{text}` is not an http:// or https:// URL");
    }
    if !url.username().is_empty() || url.password().is_some() {
        anyhow::bail!("`{text}`: an admin URL carries no user or password");
    }
    if url.query().is_some() || url.fragment().is_some() {
        anyhow::bail!("`{text}`: an admin URL has no query or fragment");
    }
    Ok(())
}

/// Checks `--heartbeat-secs`: 1 to 300.
pub(super) fn heartbeat(secs: u64) -> anyhow::Result<Duration> {
    if !(1..=300).contains(&secs) {
        anyhow::bail!("--heartbeat-secs must be between 1 and 300");
    }
    Ok(Duration::from_secs(secs))
}

/// Checks `--app-name`: 1 to 64 letters, digits, `-`, `_` or `.`.
pub(super) fn check_app_name(app_name: &str) -> anyhow::Result<()> {
    let ok = !app_name.is_empty()
        && app_name.len() <= 64
        && app_name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        anyhow::bail!("--app-name `{app_name}`: use 1 to 64 letters, digits, '-', '_' or '.'");
    }
    Ok(())
}
