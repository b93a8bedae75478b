//! Parsers for flag values, as Go's flag packages read them (pflag's CSV lists and booleans,
//! Go durations, `:9090` addresses), each bounded so that no value can panic later.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::reload::Strategy;
use crate::reload::duration::{COALESCE_WINDOW_MAX, LEADER_ELECTION_MAX, parse_go_duration};

/// A list flag's value as pflag reads a string slice: one line of CSV, so that a value in double
/// quotes keeps its commas (Reloader's chart renders `--namespace-selector="a=b,c!=d"`). Checked
/// here, split by [`csv_items`].
pub(super) fn csv_list(value: &str) -> Result<String, String> {
    split_csv(value).map(|_| value.to_string())
}

/// Every item of list flag values (each occurrence one CSV line, already checked).
pub(super) fn csv_items(values: &[String]) -> Vec<String> {
    values.iter().flat_map(|v| split_csv(v).unwrap_or_default()).collect()
}

/// One line of CSV as Go's encoding/csv reads it: fields split on commas, a field that starts
/// with `"` runs to its closing quote (`""` inside is a quote), a quote anywhere else is an error.
pub(super) fn split_csv(line: &str) -> Result<Vec<String>, String> {
    if line.is_empty() {
        return Ok(Vec::new());
    }
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Err(format!("{line:?}: a quoted value is not closed")),
                }
            }
            match chars.next() {
                None => {
                    fields.push(field);
                    return Ok(fields);
                }
                Some(',') => fields.push(field),
                Some(c) => return Err(format!("{line:?}: {c:?} after a closing quote (a comma was expected)")),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        fields.push(field);
                        return Ok(fields);
                    }
                    Some(',') => break,
                    Some('"') => return Err(format!("{line:?}: a quote inside a value that does not start with one")),
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
        }
    }
}

/// Go's `strconv.ParseBool`, which pflag uses for boolean flags.
pub(super) fn go_bool(value: &str) -> Result<bool, String> {
    crate::reload::parse_go_bool(value).ok_or_else(|| format!("{value:?} is not a boolean (expected true or false)"))
}

/// The slowest rate that is not "none": one a minute. (A rate closer to zero made a wait too
/// long for any clock: `--kube-api-qps=1e-300` panicked.)
const RATE_MIN: f64 = 1.0 / 60.0;
/// The fastest rate: more than any API server takes.
const RATE_MAX: f64 = 1_000_000.0;

/// A rate a second: 0 for none, else between one a minute and a million a second.
pub(super) fn parse_rate(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(rate) if rate == 0.0 || (RATE_MIN..=RATE_MAX).contains(&rate) => Ok(rate),
        _ => Err(format!(
            "{value:?} is not a rate: a number a second between {RATE_MIN:.4} (one a minute) and {RATE_MAX}, or 0 for none"
        )),
    }
}

/// A leader-election timing: a Go duration of at most an hour.
pub(super) fn leader_election_duration(value: &str) -> Result<Duration, String> {
    parse_go_duration(value, LEADER_ELECTION_MAX).map_err(|e| e.to_string())
}

/// A coalesce window: a Go duration of at most an hour.
pub(super) fn coalesce_window(value: &str) -> Result<Duration, String> {
    parse_go_duration(value, COALESCE_WINDOW_MAX).map_err(|e| e.to_string())
}

/// A flap damping window: a Go duration of at least a second and at most an hour.
pub(super) fn damping_window(value: &str) -> Result<Duration, String> {
    let window = parse_go_duration(value, COALESCE_WINDOW_MAX).map_err(|e| e.to_string())?;
    if window < Duration::from_secs(1) {
        return Err(format!("{value:?} is shorter than a second; a damping window is seconds to an hour"));
    }
    Ok(window)
}

pub(super) fn parse_strategy(value: &str) -> Result<Strategy, String> {
    value.parse()
}

/// `:9090` (Go style, all interfaces) or `host:port`.
pub(super) fn parse_addr(value: &str) -> Result<SocketAddr, String> {
    let full = if value.starts_with(':') { format!("0.0.0.0{value}") } else { value.to_string() };
    full.parse().map_err(|e| format!("{value:?} is not an address like :9090 or 127.0.0.1:9090 ({e})"))
}

/// An http(s) URL, or an error naming the setting it came from.
pub(super) fn parse_url(text: &str, setting: &str) -> anyhow::Result<reqwest::Url> {
    let url: reqwest::Url = text.parse().with_context(|| format!("invalid {setting} {text:?}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        bail!("invalid {setting} {text:?}: expected an http:// or https:// URL");
    }
    Ok(url)
}
