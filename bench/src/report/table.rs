//! A markdown table that leaves out the columns no row fills (a group without CPU figures
//! gets no CPU column; a group without goals, no goal columns).

/// Headers and rows of string cells; render with [`Table::render`].
#[derive(Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers and no rows.
    pub fn new<S: AsRef<str>>(headers: &[S]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.as_ref().to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are empty, extra cells are dropped.
    pub fn row(&mut self, mut cells: Vec<String>) {
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The markdown text (ending with a newline), without the columns after the first that
    /// are empty in every row; empty for a table without rows.
    pub fn render(&self) -> String {
        if self.rows.is_empty() {
            return String::new();
        }
        let keep: Vec<usize> = (0..self.headers.len())
            .filter(|&c| c == 0 || self.rows.iter().any(|r| !r[c].is_empty()))
            .collect();
        let line = |cells: &[String]| {
            let picked: Vec<String> = keep.iter().map(|&c| escape(&cells[c])).collect();
            format!("| {} |\n", picked.join(" | "))
        };
        let mut out = line(&self.headers);
        out.push_str(&format!("|{}\n", "---|".repeat(keep.len())));
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

/// A cell's text with the characters that would break a table row escaped.
fn escape(cell: &str) -> String {
    cell.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_empty_columns_and_escapes() {
        let mut t = Table::new(&["job", "value", "goal"]);
        t.row(vec!["a|b".into(), "1".into()]);
        t.row(vec!["c".into(), "2".into(), String::new()]);
        assert_eq!(
            t.render(),
            "| job | value |\n|---|---|\n| a\\|b | 1 |\n| c | 2 |\n"
        );
    }

    #[test]
    fn empty_table_renders_nothing() {
        let t = Table::new(&["a"]);
        assert!(t.is_empty());
        assert_eq!(t.render(), "");
    }
}
