//! Text tables for the command-line tools (`dog`, `cachectl`): every column as wide as its
//! widest value or header, so a 10-digit zone or a long VDI name never shifts the columns
//! after it.
//!
//! ```text
//! Address          Zone  Objects       Disk  Health
//! 127.0.0.1:7000      1      120  100.0 GiB  ok
//! 10.0.0.12:7000   4096        7    1.0 TiB  degraded(3)
//!                  a note under a row, indented to the second column
//! ```
//!
//! Widths count characters (`char`s), not bytes. Columns are separated by two spaces; a
//! left-aligned last cell is never padded, so no line ends in spaces. A row may have fewer
//! cells than the table has columns (its last cell then runs on, as a message does); it still
//! sets the widths of the columns it has, but not the width of the column its last cell is
//! in, so one long message does not widen every row.

use std::fmt::Write;

/// Where a column's values sit in its width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text: names, addresses, states.
    Left,
    /// Numbers and sizes.
    Right,
}

enum Row {
    Cells(Vec<String>),
    /// Text under the last row, starting at the column `indent` (0: at the line's start).
    Note {
        indent: usize,
        text: String,
    },
}

/// A table built row by row and rendered at once, when every width is known.
pub struct Table {
    headers: Vec<(String, Align)>,
    rows: Vec<Row>,
}

const GAP: &str = "  ";

impl Table {
    /// A table with these column headers, in this order.
    pub fn new(columns: &[(&str, Align)]) -> Table {
        Table {
            headers: columns.iter().map(|(h, a)| (h.to_string(), *a)).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row: one cell per column, or fewer (the last one then runs on).
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        assert!(
            cells.len() <= self.headers.len(),
            "a row of {} cells in a table of {} columns",
            cells.len(),
            self.headers.len()
        );
        self.rows.push(Row::Cells(cells));
    }

    /// Adds a line of free text that starts where column `column` starts (0: the line's start).
    pub fn note(&mut self, column: usize, text: impl Into<String>) {
        self.rows.push(Row::Note {
            indent: column.min(self.headers.len()),
            text: text.into(),
        });
    }

    fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.headers.iter().map(|(h, _)| width(h)).collect();
        for row in &self.rows {
            if let Row::Cells(cells) = row {
                let full = cells.len() == w.len();
                for (i, c) in cells.iter().enumerate() {
                    // A short row's last cell is a message, not a value of its column.
                    if full || i + 1 < cells.len() {
                        w[i] = w[i].max(width(c));
                    }
                }
            }
        }
        w
    }

    /// The table as text, one line per row, each ending in a newline.
    pub fn render(&self) -> String {
        let w = self.widths();
        let mut out = String::new();
        let headers: Vec<&str> = self.headers.iter().map(|(h, _)| h.as_str()).collect();
        self.line(&mut out, &w, &headers);
        for row in &self.rows {
            match row {
                Row::Cells(cells) => {
                    let cells: Vec<&str> = cells.iter().map(String::as_str).collect();
                    self.line(&mut out, &w, &cells);
                }
                Row::Note { indent, text } => {
                    let pad: usize = w[..*indent].iter().map(|x| x + GAP.len()).sum();
                    let _ = writeln!(out, "{:pad$}{text}", "");
                }
            }
        }
        out
    }

    fn line(&self, out: &mut String, w: &[usize], cells: &[&str]) {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                line += GAP;
            }
            let last = i + 1 == cells.len();
            let full = cells.len() == w.len();
            let pad = w[i].saturating_sub(width(cell));
            match self.headers[i].1 {
                // A short row's last cell runs on from where its column starts.
                Align::Right if full || !last => {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line += cell;
                }
                _ => {
                    line += cell;
                    if !last {
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

fn width(s: &str) -> usize {
    s.chars().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(rows: &[(&str, &str, &str)]) -> String {
        let mut t = Table::new(&[
            ("Address", Align::Left),
            ("Zone", Align::Right),
            ("Health", Align::Left),
        ]);
        for (a, z, h) in rows {
            t.row([*a, *z, *h]);
        }
        t.render()
    }

    /// Where each column starts on every line: the same for every line when aligned.
    fn starts(text: &str, needles: &[&[&str]]) -> Vec<Vec<usize>> {
        text.lines()
            .zip(needles)
            .map(|(l, ns)| ns.iter().map(|n| l.find(n).unwrap()).collect())
            .collect()
    }

    #[test]
    fn short_values_fit_the_headers() {
        let t = nodes(&[("1.2.3.4:7", "1", "ok")]);
        assert_eq!(t, "Address    Zone  Health\n1.2.3.4:7     1  ok\n");
    }

    #[test]
    fn long_values_widen_their_column_for_every_row() {
        let t = nodes(&[
            ("127.0.0.1:7000", "1", "ok"),
            ("127.0.0.1:7001", "4294967295", "degraded(3)"),
            ("10.0.0.1:7", "22", "FENCED"),
        ]);
        assert_eq!(
            t,
            "Address               Zone  Health\n\
             127.0.0.1:7000           1  ok\n\
             127.0.0.1:7001  4294967295  degraded(3)\n\
             10.0.0.1:7              22  FENCED\n"
        );
    }

    #[test]
    fn a_long_first_column_moves_every_other_column_together() {
        let long = "a-vdi-name-much-longer-than-its-header-or-any-default-width-of-24";
        let t = nodes(&[("x", "7", "ok"), (long, "12345678901", "ok")]);
        let s = starts(
            &t,
            &[&["Zone", "Health"], &["7", "ok"], &["12345678901", "ok"]],
        );
        assert_eq!(s[0][1], s[1][1]);
        assert_eq!(s[1][1], s[2][1]);
        // Zone is right-aligned: its values end where "Zone" ends.
        assert_eq!(s[0][0] + "Zone".len(), s[1][0] + 1);
        assert_eq!(s[0][0] + "Zone".len(), s[2][0] + "12345678901".len());
    }

    #[test]
    fn widths_count_characters_not_bytes() {
        let t = nodes(&[("été", "1", "ok"), ("abcdefghij", "2", "ok")]);
        let cols: Vec<usize> = t.lines().map(|l| l.chars().count()).collect();
        assert_eq!(cols[1], cols[2], "{t}");
    }

    #[test]
    fn no_line_ends_in_spaces() {
        let t = nodes(&[("a", "1", ""), ("b", "2", "ok")]);
        assert!(t.lines().all(|l| !l.ends_with(' ')), "{t:?}");
    }

    #[test]
    fn short_rows_run_on_without_widening_their_last_column() {
        let mut t = Table::new(&[
            ("Address", Align::Left),
            ("Objects", Align::Right),
            ("Disk", Align::Right),
        ]);
        t.row(["127.0.0.1:7000", "5", "1.0 GiB"]);
        t.row(["127.0.0.1:7001", "unreachable: connection refused"]);
        assert_eq!(
            t.render(),
            "Address         Objects     Disk\n\
             127.0.0.1:7000        5  1.0 GiB\n\
             127.0.0.1:7001  unreachable: connection refused\n"
        );
    }

    #[test]
    fn notes_start_at_their_column() {
        let mut t = Table::new(&[("Address", Align::Left), ("Epoch", Align::Right)]);
        t.row(["127.0.0.1:70000", "3"]);
        t.note(1, "waiting for 127.0.0.1:7001");
        t.note(0, "at the start");
        let r = t.render();
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(lines[2], format!("{:17}waiting for 127.0.0.1:7001", ""));
        assert_eq!(lines[3], "at the start");
    }

    #[test]
    fn an_empty_table_is_its_header() {
        let t = Table::new(&[("Name", Align::Left), ("Size", Align::Right)]);
        assert_eq!(t.render(), "Name  Size\n");
    }

    #[test]
    #[should_panic(expected = "a row of 3 cells in a table of 2 columns")]
    fn too_many_cells_is_a_bug() {
        let mut t = Table::new(&[("A", Align::Left), ("B", Align::Left)]);
        t.row(["1", "2", "3"]);
    }
}
