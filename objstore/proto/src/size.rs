//! Human sizes: `10G`, `512M`, `4MiB`, `1.5T`, plain bytes. Powers of 1024, as dog and qemu-img use.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SizeError {
    #[error("size is empty")]
    Empty,
    #[error(
        "'{0}' is not a size: expected a number with an optional unit K, M, G, T or P (e.g. 10G)"
    )]
    Malformed(String),
    #[error("size '{0}' is too large")]
    TooLarge(String),
}

/// Parses a human size. Units are binary (K = 1024) and case-insensitive; `B`, `iB` suffixes allowed.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        _ => return Err(SizeError::Malformed(text.to_string())),
    };
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(SizeError::Malformed(text.to_string()));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(1u64 << shift)
            .ok_or_else(|| SizeError::TooLarge(text.to_string()));
    }
    let f: f64 = num
        .parse()
        .map_err(|_| SizeError::Malformed(text.to_string()))?;
    let bytes = f * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(SizeError::TooLarge(text.to_string()));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes the way `dog` prints them: `4.0 MiB`, `1.0 GiB`, `512 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("4mb"), Ok(4 << 20));
        assert_eq!(parse_size("1.5k"), Ok(1536));
        assert_eq!(parse_size(" 2T "), Ok(2 << 40));
    }

    #[test]
    fn rejects() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert!(matches!(parse_size("10X"), Err(SizeError::Malformed(_))));
        assert!(matches!(parse_size("G"), Err(SizeError::Malformed(_))));
        assert!(matches!(parse_size("-1"), Err(SizeError::Malformed(_))));
        assert!(matches!(parse_size("1.2.3"), Err(SizeError::Malformed(_))));
        assert!(matches!(
            parse_size("99999999999P"),
            Err(SizeError::TooLarge(_))
        ));
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(4 << 20), "4.0 MiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }
}
