//! Human durations for command lines: `5s`, `500ms`, `1.5s`, `2m`, `1h`; a plain number is
//! seconds (`30`), so `--timeout 30` keeps meaning what it always meant.

use std::time::Duration;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurationError {
    #[error("duration is empty")]
    Empty,
    #[error(
        "'{0}' is not a duration: expected a number with an optional unit ms, s, m or h \
         (e.g. 5s, 500ms; a plain number is seconds)"
    )]
    Malformed(String),
    #[error("duration '{0}' is too long")]
    TooLong(String),
}

/// Parses a human duration; units are case-insensitive, a missing unit means seconds.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(DurationError::Empty);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let secs_per_unit = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" => 1e-3,
        "" | "s" | "sec" | "secs" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(DurationError::Malformed(text.to_string())),
    };
    if num.is_empty() || num.matches('.').count() > 1 || num == "." {
        return Err(DurationError::Malformed(text.to_string()));
    }
    let n: f64 = num
        .parse()
        .map_err(|_| DurationError::Malformed(text.to_string()))?;
    Duration::try_from_secs_f64(n * secs_per_unit)
        .map_err(|_| DurationError::TooLong(text.to_string()))
}

/// Formats a duration the way [`parse_duration`] reads it back: `5s`, `500ms`, `1.5s`.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{}s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration(" 5 S "), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects() {
        assert_eq!(parse_duration(" "), Err(DurationError::Empty));
        for bad in ["s", "5x", "-1", "1.2.3", ".", "5 days", "ms5"] {
            assert!(
                matches!(parse_duration(bad), Err(DurationError::Malformed(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_duration("1e300h"),
            Err(DurationError::Malformed(_))
        ));
        assert!(matches!(
            parse_duration("99999999999999999999999h"),
            Err(DurationError::TooLong(_))
        ));
    }

    #[test]
    fn formats_what_it_parses() {
        for d in [
            Duration::from_secs(5),
            Duration::from_millis(500),
            Duration::from_millis(1500),
        ] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }
}
