//! The one duration parser: every duration the project reads (flags, environment, config file,
//! annotations) is a Go duration (`time.ParseDuration`, as Reloader reads them) with a ceiling
//! for its use.
//!
//! Durations come from people and from the cluster, so they are untrusted: the arithmetic is
//! checked integer arithmetic (no float seconds, which panic when converted back out of range),
//! the text is bounded, and a value past its use's ceiling is refused here, before a timer
//! queue or an `Instant` addition can panic on it. The ceilings are the per-use constants below.

use std::fmt;
use std::time::Duration;

/// A Reloader pause period (`deployment.reloader.stakater.com/pause-period`): hours, not years.
pub const PAUSE_PERIOD_MAX: Duration = Duration::from_secs(24 * 3600);
/// A coalesce window (`--coalesce-window`, `reloader-fleet.stakater.com/coalesce-window`).
pub const COALESCE_WINDOW_MAX: Duration = Duration::from_secs(3600);
/// The leader-election timings (`--leader-election-lease-duration` and its two siblings).
pub const LEADER_ELECTION_MAX: Duration = Duration::from_secs(3600);

/// Longest text read as a duration; `1h2m3s4ms5us6ns` is 15 characters.
const TEXT_LIMIT: usize = 64;
/// Fraction digits kept (beyond them the value changes by less than a nanosecond of an hour).
const FRACTION_DIGITS: u32 = 18;

/// Why a text is no usable duration. The messages leave the text out: the caller shows it
/// (clap names the flag and the value; a [`Problem`](crate::reload::Problem) has the value).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not Go's duration syntax, negative, or over 64 characters. The same text never parses.
    #[error("not a duration (examples: 15s, 500ms, 1m30s)")]
    Invalid,
    /// A duration, but longer than its use allows.
    #[error("longer than the {0} allowed here")]
    TooLong(GoDuration),
}

/// A duration printed the way Go prints one (`1h0m0s`, `500ms`), for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        let secs = d.as_secs();
        if secs == 0 {
            return match d.subsec_nanos() {
                0 => f.write_str("0s"),
                n if n % 1_000_000 == 0 => write!(f, "{}ms", n / 1_000_000),
                n => write!(f, "{}ns", n),
            };
        }
        let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
        let fraction = match d.subsec_nanos() {
            0 => String::new(),
            n => format!(".{:09}", n).trim_end_matches('0').to_string(),
        };
        match (h, m) {
            (0, 0) => write!(f, "{s}{fraction}s"),
            (0, _) => write!(f, "{m}m{s}{fraction}s"),
            _ => write!(f, "{h}h{m}m{s}{fraction}s"),
        }
    }
}

/// Parse a Go duration (`15s`, `1m30s`, `1.5h`, `300ms`; a bare `0`) no longer than `max`.
///
/// # Errors
/// [`DurationError::Invalid`] for anything Go would refuse, a negative duration, or text over
/// 64 characters; [`DurationError::TooLong`] past `max` (including values too large for any
/// clock). Never panics.
pub fn parse_go_duration(value: &str, max: Duration) -> Result<Duration, DurationError> {
    let text = value.trim();
    if text.is_empty() || text.len() > TEXT_LIMIT {
        return Err(DurationError::Invalid);
    }
    let text = text.strip_prefix('+').unwrap_or(text);
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let too_long = || DurationError::TooLong(GoDuration(max));
    let mut nanos: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let (whole, whole_digits, after) = leading_number(rest);
        let (fraction, fraction_digits, after) = match after.strip_prefix('.') {
            Some(after) => leading_fraction(after),
            None => (0, 0, after),
        };
        if whole_digits == 0 && fraction_digits == 0 {
            return Err(DurationError::Invalid);
        }
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let unit: u128 = match &after[..unit_len] {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ns" => 1,
            _ => return Err(DurationError::Invalid),
        };
        let whole = whole.ok_or_else(too_long)?;
        let part = whole.checked_mul(unit).ok_or_else(too_long)?;
        // Truncated as Go truncates: the fraction of the unit, in whole nanoseconds.
        let fractional = fraction * unit / 10u128.pow(fraction_digits.min(FRACTION_DIGITS));
        nanos = nanos.checked_add(part).and_then(|n| n.checked_add(fractional)).ok_or_else(too_long)?;
        rest = &after[unit_len..];
    }
    let max_nanos = max.as_nanos();
    if nanos > max_nanos {
        return Err(too_long());
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| too_long())?;
    let subsec = u32::try_from(nanos % 1_000_000_000).map_err(|_| too_long())?;
    Ok(Duration::new(secs, subsec))
}

/// The leading digits of `text` as a number (`None` when too large for any duration), how many
/// digits there were, and what follows them.
fn leading_number(text: &str) -> (Option<u128>, u32, &str) {
    let end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let mut number = Some(0u128);
    for digit in text[..end].bytes() {
        number = number.and_then(|n| n.checked_mul(10)).and_then(|n| n.checked_add(u128::from(digit - b'0')));
    }
    (number, u32::try_from(end).unwrap_or(u32::MAX), &text[end..])
}

/// The digits after a decimal point, the first [`FRACTION_DIGITS`] of them as a number, how
/// many were kept, and what follows them.
fn leading_fraction(text: &str) -> (u128, u32, &str) {
    let end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let mut number = 0u128;
    let mut kept = 0;
    for digit in text[..end].bytes().take(FRACTION_DIGITS as usize) {
        number = number * 10 + u128::from(digit - b'0');
        kept += 1;
    }
    (number, kept, &text[end..])
}

/// A value as it may be shown in a message, an Event or a log line: at most 64 characters.
pub fn shown(value: &str) -> String {
    if value.chars().count() <= TEXT_LIMIT {
        return value.to_string();
    }
    let head: String = value.chars().take(TEXT_LIMIT).collect();
    format!("{head}... ({} bytes)", value.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn parse(text: &str) -> Result<Duration, DurationError> {
        parse_go_duration(text, DAY)
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("5.s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("+2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("1us1\u{b5}s1\u{3bc}s1ns"), Ok(Duration::from_nanos(3001)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("1.0000000000000000000000001s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn what_go_refuses_is_refused() {
        for bad in ["", "15", "5 minutes", "s", ".s", "1.2.3s", "-5s", "1d", "1h-5m", "3", "1e3s", "ms5"] {
            assert_eq!(parse(bad), Err(DurationError::Invalid), "{bad:?}");
        }
    }

    #[test]
    fn a_duration_of_years_is_too_long_and_never_panics() {
        // Each of these panicked in Duration::from_secs_f64 or in a timer queue before.
        for long in ["99999999999999999999999h", "20000h", "25h", "1e400h", "340282366920938463463374607431768211456ns"]
        {
            let result = parse(long);
            assert!(result.is_err(), "{long:?} accepted as {result:?}");
        }
        assert_eq!(parse("25h").map_err(|e| e.to_string()), Err("longer than the 24h0m0s allowed here".to_string()));
        assert_eq!(parse("24h"), Ok(DAY));
    }

    #[test]
    fn long_text_is_refused_and_shown_short() {
        let long = "1".repeat(10_000) + "s";
        assert_eq!(parse(&long), Err(DurationError::Invalid));
        assert_eq!(shown(&long), format!("{}... (10001 bytes)", "1".repeat(64)));
        assert_eq!(shown("15s"), "15s");
    }

    #[test]
    fn durations_print_as_go_prints_them() {
        assert_eq!(GoDuration(Duration::from_secs(3600)).to_string(), "1h0m0s");
        assert_eq!(GoDuration(Duration::from_secs(90)).to_string(), "1m30s");
        assert_eq!(GoDuration(Duration::from_millis(1500)).to_string(), "1.5s");
        assert_eq!(GoDuration(Duration::from_millis(500)).to_string(), "500ms");
        assert_eq!(GoDuration(Duration::ZERO).to_string(), "0s");
    }
}
