//! VDI names: what a name may be, checked once for every layer.

use thiserror::Error;

/// A name that cannot be a VDI's.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid VDI name {name:?}: {reason}")]
pub struct InvalidName {
    pub name: String,
    pub reason: &'static str,
}

/// Checks a VDI name: 1 to 255 bytes, no `/`, NUL or `@`, not `.` or `..`.
pub fn validate_name(name: &str) -> Result<(), InvalidName> {
    let bad = |reason| {
        Err(InvalidName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("the name is empty");
    }
    if name.len() > 255 {
        return bad("the name is longer than 255 bytes");
    }
    if name.contains('/') {
        return bad("the name contains '/'");
    }
    if name.contains('\0') {
        return bad("the name contains a NUL byte");
    }
    if name.contains('@') {
        return bad("the name contains '@' (reserved for snapshots)");
    }
    if name == "." || name == ".." {
        return bad("'.' and '..' are not names");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("demo-1.img").is_ok());
        for bad in ["", "a/b", "a\0b", "snap@1", ".", ".."] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_name(&"x".repeat(255)).is_ok());
        assert!(validate_name(&"x".repeat(256)).is_err());
    }
}
