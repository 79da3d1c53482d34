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

/// Checks a snapshot tag: what a name may be (1 to 255 bytes, no `/`, NUL or `@`).
pub fn validate_tag(tag: &str) -> Result<(), InvalidName> {
    validate_name(tag).map_err(|e| InvalidName {
        name: tag.to_string(),
        reason: match e.reason {
            "the name is empty" => "the snapshot tag is empty",
            "the name contains '@' (reserved for snapshots)" => "a snapshot tag cannot contain '@'",
            r => r,
        },
    })
}

/// Splits `NAME` or `NAME@TAG` (a snapshot) into the VDI name and the tag, each checked.
pub fn split_snapshot(full: &str) -> Result<(&str, Option<&str>), InvalidName> {
    match full.split_once('@') {
        None => validate_name(full).map(|()| (full, None)),
        Some((name, tag)) => {
            validate_name(name).map_err(|e| InvalidName {
                name: full.to_string(),
                reason: e.reason,
            })?;
            validate_tag(tag).map_err(|e| InvalidName {
                name: full.to_string(),
                reason: e.reason,
            })?;
            Ok((name, Some(tag)))
        }
    }
}

/// `NAME@TAG`.
pub fn snapshot_name(name: &str, tag: &str) -> String {
    format!("{name}@{tag}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names() {
        assert_eq!(split_snapshot("disk").unwrap(), ("disk", None));
        assert_eq!(
            split_snapshot("disk@before").unwrap(),
            ("disk", Some("before"))
        );
        for bad in ["@x", "disk@", "disk@a@b", "a/b@x", "disk@a/b"] {
            let e = split_snapshot(bad).unwrap_err();
            assert_eq!(e.name, bad);
        }
        assert_eq!(
            split_snapshot("disk@a@b").unwrap_err().reason,
            "a snapshot tag cannot contain '@'"
        );
        assert_eq!(snapshot_name("d", "t"), "d@t");
    }

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
