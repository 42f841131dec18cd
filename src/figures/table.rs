//! The results table in the layout of the paper's Tables 1–2: method rows × benchmark columns,
//! avg@k ± standard error (in %), Δ vs the base row, and the mean over benchmarks; written as
//! Markdown, CSV and LaTeX.

use crate::evaluation::BenchmarkSummary;

pub struct Cell {
    pub summary: BenchmarkSummary,
    /// avg@k minus the base row's on the same benchmark (None for the base row itself).
    pub delta: Option<f64>,
}

pub struct TableRow {
    pub label: String,
    /// One per benchmark column (None: this method was not evaluated on it).
    pub cells: Vec<Option<Cell>>,
    /// Where the row's numbers came from (e.g. `grpo.eval[19] 3f2a…`), for the provenance section.
    pub source: String,
}

pub struct ResultsTable {
    pub title: String,
    pub benchmarks: Vec<String>,
    pub rows: Vec<TableRow>,
}

impl TableRow {
    /// Mean avg@k over the benchmarks this row has (None if it has none).
    pub fn average(&self) -> Option<f64> {
        let v: Vec<f64> = self.cells.iter().flatten().map(|c| c.summary.mean).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }

    pub fn average_delta(&self) -> Option<f64> {
        let v: Vec<f64> = self.cells.iter().flatten().filter_map(|c| c.delta).collect();
        (!v.is_empty() && v.len() == self.cells.iter().flatten().count()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1}", 100.0 * x)
    } else {
        "n/a".into()
    }
}

fn signed_pct(x: f64) -> String {
    format!("{}{:.1}", if x >= 0.0 { "+" } else { "" }, 100.0 * x)
}

impl ResultsTable {
    fn k_label(&self, col: usize) -> String {
        let k = self.rows.iter().filter_map(|r| r.cells[col].as_ref()).map(|c| c.summary.k).max().unwrap_or(0);
        format!("avg@{k}")
    }

    pub fn markdown(&self) -> String {
        let mut s = format!("### {}\n\n| Method |", self.title);
        for (i, b) in self.benchmarks.iter().enumerate() {
            s += &format!(" {b} ({}) |", self.k_label(i));
        }
        s += " Avg |\n| --- |";
        s += &" ---: |".repeat(self.benchmarks.len() + 1);
        s += "\n";
        for r in &self.rows {
            s += &format!("| {} |", r.label);
            for c in &r.cells {
                s += &match c {
                    Some(c) => format!(
                        " {} ± {}{} |",
                        pct(c.summary.mean),
                        pct(c.summary.stderr),
                        c.delta.map(|d| format!(" ({})", signed_pct(d))).unwrap_or_default()
                    ),
                    None => " – |".into(),
                };
            }
            s += &format!(
                " {}{} |\n",
                r.average().map(pct).unwrap_or("–".into()),
                r.average_delta().map(|d| format!(" ({})", signed_pct(d))).unwrap_or_default()
            );
        }
        s
    }

    /// Long form: one line per (method, benchmark) with the raw fractions.
    pub fn csv(&self) -> String {
        let mut s = String::from("table,method,benchmark,k,problems,samples,avg,stderr,delta_vs_base,unparseable,source\n");
        for r in &self.rows {
            for (b, c) in self.benchmarks.iter().zip(&r.cells) {
                if let Some(c) = c {
                    let m = &c.summary;
                    s += &format!(
                        "{},{},{},{},{},{},{},{},{},{},{}\n",
                        csv_field(&self.title),
                        csv_field(&r.label),
                        csv_field(b),
                        m.k,
                        m.problems,
                        m.samples,
                        m.mean,
                        m.stderr,
                        c.delta.map(|d| d.to_string()).unwrap_or_default(),
                        m.unparseable,
                        csv_field(&r.source)
                    );
                }
            }
        }
        s
    }

    pub fn latex(&self) -> String {
        let mut s = format!(
            "% {}\n\\begin{{tabular}}{{l{}r}}\n\\toprule\nMethod",
            self.title,
            "r".repeat(self.benchmarks.len())
        );
        for (i, b) in self.benchmarks.iter().enumerate() {
            s += &format!(" & {} ({})", tex(b), self.k_label(i));
        }
        s += " & Avg \\\\\n\\midrule\n";
        for r in &self.rows {
            s += &tex(&r.label);
            for c in &r.cells {
                s += &match c {
                    Some(c) => format!(
                        " & ${} \\pm {}${}",
                        pct(c.summary.mean),
                        pct(c.summary.stderr),
                        c.delta.map(|d| format!(" \\,({})", signed_pct(d))).unwrap_or_default()
                    ),
                    None => " & --".into(),
                };
            }
            s += &format!(" & {} \\\\\n", r.average().map(pct).unwrap_or("--".into()));
        }
        s += "\\bottomrule\n\\end{tabular}\n";
        s
    }
}

pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn tex(s: &str) -> String {
    let mut out = String::new();
    for ch in s.chars() {
        match ch {
            '_' | '%' | '&' | '#' | '$' | '{' | '}' => {
                out.push('\\');
                out.push(ch);
            }
            '\\' => out += "\\textbackslash{}",
            '~' => out += "\\textasciitilde{}",
            '^' => out += "\\textasciicircum{}",
            _ => out.push(ch),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(b: &str, mean: f64) -> BenchmarkSummary {
        BenchmarkSummary { benchmark: b.into(), problems: 10, samples: 40, k: 4, mean, stderr: 0.05, unparseable: 3 }
    }

    fn table() -> ResultsTable {
        let row = |label: &str, a: f64, b: Option<f64>, base: Option<(f64, f64)>| TableRow {
            label: label.into(),
            cells: vec![
                Some(Cell { summary: summary("x_1", a), delta: base.map(|(ba, _)| a - ba) }),
                b.map(|b| Cell { summary: summary("y", b), delta: base.map(|(_, bb)| b - bb) }),
            ],
            source: format!("{label}.eval"),
        };
        ResultsTable {
            title: "Results (verifier)".into(),
            benchmarks: vec!["x_1".into(), "y".into()],
            rows: vec![row("base", 0.25, Some(0.5), None), row("GRPO, v2", 0.375, None, Some((0.25, 0.5)))],
        }
    }

    #[test]
    fn markdown_csv_and_latex_carry_the_same_numbers() {
        let t = table();
        let md = t.markdown();
        assert!(md.contains("| Method | x_1 (avg@4) | y (avg@4) | Avg |"), "{md}");
        assert!(md.contains("| base | 25.0 ± 5.0 | 50.0 ± 5.0 | 37.5 |"), "{md}");
        assert!(md.contains("| GRPO, v2 | 37.5 ± 5.0 (+12.5) | – | 37.5 (+12.5) |"), "{md}");
        let csv = t.csv();
        assert_eq!(csv.lines().count(), 4, "{csv}");
        assert!(csv.contains("Results (verifier),\"GRPO, v2\",x_1,4,10,40,0.375,0.05,0.125,3,\"GRPO, v2.eval\""), "{csv}");
        let tex = t.latex();
        assert!(tex.contains("Method & x\\_1 (avg@4) & y (avg@4) & Avg \\\\"), "{tex}");
        assert!(tex.contains("GRPO, v2 & $37.5 \\pm 5.0$ \\,(+12.5) & -- & 37.5 \\\\"), "{tex}");
    }
}
