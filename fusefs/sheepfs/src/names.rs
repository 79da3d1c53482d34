//! Inode numbers: one per name (a VDI `NAME` or a snapshot `NAME@TAG`), given the first time
//! the mount sees the name and kept for the mount's life. Not the VDI's id: a snapshot or a
//! rollback gives `NAME` a new id (its old inode becomes `NAME@TAG`), and a file open under
//! `NAME` must go on under the same inode number, with the VDI's new inode behind it. A name
//! deleted through this mount is forgotten, so a VDI created again under it is a new file.

use std::collections::HashMap;

/// The root directory's inode number.
pub(crate) const ROOT: u64 = 1;

#[derive(Debug)]
pub(crate) struct Names {
    by_ino: HashMap<u64, String>,
    by_name: HashMap<String, u64>,
    next: u64,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            by_ino: HashMap::new(),
            by_name: HashMap::new(),
            next: ROOT + 1,
        }
    }
}

impl Names {
    /// The inode number of `name`, given now if it has none.
    pub(crate) fn ino(&mut self, name: &str) -> u64 {
        if let Some(&ino) = self.by_name.get(name) {
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_name.insert(name.to_string(), ino);
        self.by_ino.insert(ino, name.to_string());
        ino
    }

    /// The inode number of `name` if it has one.
    pub(crate) fn known(&self, name: &str) -> Option<u64> {
        self.by_name.get(name).copied()
    }

    pub(crate) fn name(&self, ino: u64) -> Option<&str> {
        self.by_ino.get(&ino).map(String::as_str)
    }

    /// Forgets `name` (deleted through this mount).
    pub(crate) fn forget(&mut self, name: &str) {
        if let Some(ino) = self.by_name.remove(name) {
            self.by_ino.remove(&ino);
        }
    }
}

/// Whether `name` is a snapshot (`NAME@TAG`): a read-only file.
pub(crate) fn is_snapshot(name: &str) -> bool {
    name.contains('@')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_keeps_its_number_until_forgotten() {
        let mut n = Names::default();
        let a = n.ino("a");
        let snap = n.ino("a@t");
        assert!(a > ROOT && snap > ROOT && a != snap);
        assert_eq!(n.ino("a"), a, "stable");
        assert_eq!(n.name(a), Some("a"));
        assert_eq!(n.known("a@t"), Some(snap));
        n.forget("a");
        assert_eq!(n.name(a), None);
        assert_ne!(n.ino("a"), a, "created again: a new file");
        assert!(is_snapshot("a@t") && !is_snapshot("a"));
    }
}
