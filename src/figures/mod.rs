//! What the stages that write reports (`report`, `analysis`, `credit_benchmark`) share: the
//! figures ([`plots`]), the paper's results table ([`table`]), data tables written as Parquet, CSV
//! and Markdown at once, and the provenance line behind every number.

pub mod plots;
pub mod table;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::artifact::{write_rows, Schema};
use crate::engine::spec::{short, InputSource};
use crate::engine::StageContext;
use table::csv_field;

/// Members of input group `group`: (label, path), in input-name order.
pub fn members<'a>(ctx: &'a StageContext, group: &str) -> Vec<(&'a str, &'a Path)> {
    let prefix = format!("{group}.");
    ctx.inputs.iter().filter_map(|(n, (_, p))| Some((n.strip_prefix(&prefix)?, p.as_path()))).collect()
}

/// `instance (key…) sha256 …` of an input: what the provenance section prints.
pub fn provenance(ctx: &StageContext, input: &str) -> String {
    let hash = ctx.input_hashes.get(input).map(|h| short(h).to_string()).unwrap_or_default();
    match ctx.input_sources.get(input) {
        Some(InputSource::Instance { key, stage, output }) => format!("{stage}.{output} (instance {}, artifact {hash})", short(key)),
        Some(InputSource::File { path }) => format!("file {} (artifact {hash})", path.display()),
        None => format!("artifact {hash}"),
    }
}

/// `## Figures` with a Markdown image link to each PNG of `figures` (files beside results.md).
pub fn figures_section(figures: &[PathBuf]) -> String {
    let mut md = "## Figures\n\n".to_string();
    for f in figures.iter().filter(|f| f.extension().is_some_and(|e| e == "png")) {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        let _ = writeln!(md, "![{name}]({name})");
    }
    md
}

/// A table cell: text, an integer or a number (NaN = undefined: empty in CSV, – in Markdown).
pub enum Cell {
    Text(String),
    Int(i64),
    Num(f64),
    /// A number shown in Markdown with two significant digits and its exponent (a p-value).
    Sci(f64),
}

/// Writes `<name>.parquet` and `<name>.csv` into `dir` and returns the Markdown table.
pub fn write_table<T: Serialize>(dir: &Path, name: &str, rows: &[T], header: &[&str], cells: impl Fn(&T) -> Vec<Cell>) -> Result<String> {
    write_rows(&dir.join(format!("{name}.parquet")), Schema::Table, rows)?;
    let mut csv = header.join(",") + "\n";
    let mut md = format!("| {} |\n|{}\n", header.join(" | "), " --- |".repeat(header.len()));
    for r in rows {
        let cs = cells(r);
        let c: Vec<String> = cs
            .iter()
            .map(|c| match c {
                Cell::Text(s) => csv_field(s),
                Cell::Int(i) => i.to_string(),
                Cell::Num(x) | Cell::Sci(x) if x.is_nan() => String::new(),
                Cell::Num(x) | Cell::Sci(x) => x.to_string(),
            })
            .collect();
        let m: Vec<String> = cs
            .iter()
            .map(|c| match c {
                Cell::Text(s) => s.clone(),
                Cell::Int(i) => i.to_string(),
                Cell::Num(x) | Cell::Sci(x) if x.is_nan() => "–".into(),
                Cell::Num(x) => format!("{x:.3}"),
                Cell::Sci(x) => format!("{x:.1e}"),
            })
            .collect();
        csv += &(c.join(",") + "\n");
        md += &format!("| {} |\n", m.join(" | "));
    }
    std::fs::write(dir.join(format!("{name}.csv")), csv)?;
    Ok(md)
}
