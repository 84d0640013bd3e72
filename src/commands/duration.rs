//! `--duration SECS`: parsing (for clap) and printing.
//!
//! The one idea: a duration is checked once, where the command line is parsed, against
//! limits the message states — at least a millisecond (shorter cannot be waited for and
//! could not be printed), at most 10^9 s (about 31 years) — and printed back exactly as
//! given (to the millisecond), so `0.005` never shows as `0.0 s`.

pub use crate::quantities::{format_elapsed, format_seconds};
use std::time::Duration;

/// The shortest duration accepted.
pub const MIN: Duration = Duration::from_millis(1);
/// The longest duration accepted, in seconds.
pub const MAX_SECONDS: f64 = 1e9;

/// Parses a number of seconds (`2`, `0.5`, `1e3`) into a duration within the limits;
/// the error says which limit, for clap to print after the value.
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| "must be a number of seconds, such as 5 or 0.5".to_string())?;
    if seconds.is_nan() {
        return Err("must be a number of seconds, such as 5 or 0.5".into());
    }
    if seconds <= 0.0 {
        return Err("must be a positive number of seconds".into());
    }
    if seconds > MAX_SECONDS {
        return Err(format!(
            "must be at most {MAX_SECONDS:.0} seconds (about 31 years); leave --duration out to stop with Ctrl-C"
        ));
    }
    let duration = Duration::from_secs_f64(seconds);
    if duration < MIN {
        return Err("must be at least 0.001 seconds (a millisecond)".into());
    }
    Ok(duration)
}

/// How long a command waits, for its starting line: `for 5.0 s (Ctrl-C ends early)`, or
/// `until Ctrl-C` without a duration.
pub fn how_long(duration: Option<Duration>) -> String {
    match duration {
        Some(d) => format!("for {} s (Ctrl-C ends early)", format_seconds(d)),
        None => "until Ctrl-C".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_stated() {
        assert_eq!(parse_seconds("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_seconds("0.001"), Ok(MIN));
        assert_eq!(parse_seconds("1e9"), Ok(Duration::from_secs(1_000_000_000)));
        assert!(parse_seconds("-1").unwrap_err().contains("positive"));
        assert!(parse_seconds("0").unwrap_err().contains("positive"));
        assert!(
            parse_seconds("0.0001")
                .unwrap_err()
                .contains("at least 0.001")
        );
        let too_long = parse_seconds("1e300").unwrap_err();
        assert!(
            too_long.contains("at most 1000000000 seconds"),
            "{too_long}"
        );
        assert!(
            parse_seconds("99999999999")
                .unwrap_err()
                .contains("at most")
        );
        assert!(parse_seconds("inf").unwrap_err().contains("at most"));
        assert!(
            parse_seconds("NaN")
                .unwrap_err()
                .contains("number of seconds")
        );
        assert!(
            parse_seconds("abc")
                .unwrap_err()
                .contains("number of seconds")
        );
    }

    #[test]
    fn printed_to_the_millisecond() {
        let s = |secs: f64| format_seconds(Duration::from_secs_f64(secs));
        assert_eq!(s(5.0), "5.0");
        assert_eq!(s(0.25), "0.25");
        assert_eq!(s(0.001), "0.001");
        assert_eq!(s(1.5), "1.5");
        assert_eq!(s(1e9), "1000000000.0");
        assert_eq!(format_elapsed(Duration::from_millis(2049)), "2.0");
        assert_eq!(format_elapsed(Duration::from_millis(3)), "0.003");
    }
}
