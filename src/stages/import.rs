//! `import`: prompts from a JSONL or Parquet file in one of the common dataset layouts, as a
//! `prompts` artifact (DESIGN.md §4).
//!
//! Layouts (`layout` param; `auto` picks by the columns present):
//! - `verl`: `prompt` (chat messages), `reward_model.ground_truth` (answer), solution from
//!   `extra_info.solution`, else `extra_info.answer` when it is a worked `… #### N` text;
//!   `data_source` names the source.
//! - `hf`: `problem`, `solution`, `answer`.
//! - `gsm8k`: `question`, and `answer` holding a worked solution ending in `#### N`: the solution
//!   is the text before `####`, the answer is `N`.
//! - `qa`: `question`, `answer` (the final answer itself), `solution` (Minerva-Math, some AIME
//!   files). `auto` picks it for `question`/`answer` files whose answers hold no `####`.
//!
//! The `hf` and `qa` layouts' default `solution` column may be absent (evaluation sets without
//! worked solutions): rows then count as `missing_solution`. A solution column named by
//! `solution_col` must exist.
//!
//! `prompt_col`, `solution_col`, `answer_col`, `id_col` override a layout's columns (dotted paths
//! reach into nested objects/structs; `none` means the dataset has no such column).
//! `answer_col = "boxed:COL"` takes each row's answer from the last `\boxed{}` of column `COL`
//! (with the boxes just before it that belong to it, as the verifier reads a response), for
//! datasets that ship worked solutions but no answer column (NuminaMath-CoT, MATH's train/test);
//! a row whose cell has no box has no answer. Columns not
//! used go into `meta` with the file name and row. A mapping naming a column the file lacks is an
//! error naming file and column, nested paths included (`reward_model.ground_truth` in a file
//! whose `reward_model` has no `ground_truth` in any row); rows with non-UTF-8 text or no prompt
//! are skipped, counted (`skipped_non_utf8`, `skipped_no_prompt`, also on stderr) and listed with
//! their reason in the `skipped` table; rows without solution or answer are kept with nulls and
//! counted (`missing_solution`, `missing_answer`) for `filter` to judge.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use arrow::array::{Array, AsArray, GenericBinaryArray, OffsetSizeTrait, RecordBatch};
use arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type,
    UInt32Type, UInt64Type, UInt8Type,
};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::skipped::{self, SkippedRow};
use crate::artifact::rows::PromptRow;
use crate::artifact::{read_batches, write_rows, Schema};
use crate::engine::{Builtin, Executable, StageContext};
use crate::prompt_text::message_content_text;

/// One data row of the source file: its JSON object, or why it could not be read.
#[derive(Debug)]
pub enum SourceRow {
    Ok(Map<String, Value>),
    /// Text that is not UTF-8 (a JSONL line, or a Parquet binary cell), with where it is.
    NonUtf8(String),
}

/// The rows of a JSONL (`.jsonl`, `.ndjson`, `.json` with one object per line or one array of
/// objects) or Parquet file, and the column names seen (top level).
pub fn read_source(path: &Path) -> anyhow::Result<(Vec<SourceRow>, BTreeSet<String>)> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    match ext.as_str() {
        "parquet" => read_parquet(path),
        "jsonl" | "json" | "ndjson" => read_jsonl(path),
        _ => bail!(
            "{}: unknown dataset format (expected .jsonl, .json, .ndjson or .parquet)",
            path.display()
        ),
    }
}

fn read_jsonl(path: &Path) -> anyhow::Result<(Vec<SourceRow>, BTreeSet<String>)> {
    let bytes = std::fs::read(path).with_context(|| format!("{}: reading", path.display()))?;
    // Editors on Windows start UTF-8 files with a byte-order mark.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let mut rows = Vec::new();
    let mut columns = BTreeSet::new();
    if bytes.trim_ascii_start().starts_with(b"[") {
        // A `.json` file holding one array of objects.
        let text = std::str::from_utf8(bytes)
            .map_err(|e| anyhow!("{}: not UTF-8 at byte {}", path.display(), e.valid_up_to()))?;
        let items: Vec<Box<RawValue>> = serde_json::from_str(text)
            .map_err(|e| anyhow!("{}: invalid JSON array: {e}", path.display()))?;
        for (i, raw) in items.into_iter().enumerate() {
            let v = exact_json(raw.get()).map_err(|e| anyhow!("{}: element {i}: {e}", path.display()))?;
            let Value::Object(obj) = v else {
                bail!("{}: element {i}: expected a JSON object", path.display());
            };
            columns.extend(obj.keys().cloned());
            rows.push(SourceRow::Ok(obj));
        }
        return Ok((rows, columns));
    }
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        let line_no = i + 1;
        let Ok(text) = std::str::from_utf8(line) else {
            rows.push(SourceRow::NonUtf8(format!(
                "{}: line {line_no}",
                path.display()
            )));
            continue;
        };
        if text.trim().is_empty() {
            continue;
        }
        let v = exact_json(text).map_err(|e| {
            let hint = if e.is_eof() {
                " (one JSON object per line is expected, or a .json file holding one array of objects)"
            } else {
                ""
            };
            anyhow!("{}: line {line_no}: invalid JSON: {e}{hint}", path.display())
        })?;
        let Value::Object(obj) = v else {
            bail!(
                "{}: line {line_no}: expected a JSON object per line",
                path.display()
            );
        };
        columns.extend(obj.keys().cloned());
        rows.push(SourceRow::Ok(obj));
    }
    Ok((rows, columns))
}

/// A JSON text as a value whose numbers keep every digit written: one that an f64 or a 64-bit
/// integer would round (a 23-digit integer answer, 17 significant digits) is kept as its text.
fn exact_json(text: &str) -> serde_json::Result<Value> {
    let t = text.trim();
    match t.as_bytes().first() {
        Some(b'{') => {
            let fields: BTreeMap<String, Box<RawValue>> = serde_json::from_str(t)?;
            fields.into_iter().map(|(k, v)| Ok((k, exact_json(v.get())?))).collect::<serde_json::Result<Map<_, _>>>().map(Value::Object)
        }
        Some(b'[') => {
            let items: Vec<Box<RawValue>> = serde_json::from_str(t)?;
            items.iter().map(|v| exact_json(v.get())).collect::<serde_json::Result<Vec<_>>>().map(Value::Array)
        }
        Some(b'-' | b'0'..=b'9') => {
            let v: Value = serde_json::from_str(t)?;
            Ok(if number_is_exact(t, &v) { v } else { Value::String(t.to_string()) })
        }
        _ => serde_json::from_str(t),
    }
}

/// Whether a JSON number's text reads exactly as `v`: an integer fits 64 bits, a fraction has at
/// most 15 significant digits (what an f64 keeps for any decimal).
fn number_is_exact(text: &str, v: &Value) -> bool {
    if !text.contains(['.', 'e', 'E']) {
        return v.is_i64() || v.is_u64();
    }
    let mantissa = text.split(['e', 'E']).next().unwrap_or("");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    digits.trim_start_matches('0').trim_end_matches('0').len() <= 15
}

fn read_parquet(path: &Path) -> anyhow::Result<(Vec<SourceRow>, BTreeSet<String>)> {
    let batch = read_batches(path)?;
    let columns: BTreeSet<String> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    Ok((batch_rows(path, &batch)?, columns))
}

/// Rows of a record batch as JSON objects.
fn batch_rows(path: &Path, batch: &RecordBatch) -> anyhow::Result<Vec<SourceRow>> {
    let n = batch.num_rows();
    let mut bad: Vec<Option<String>> = vec![None; n];
    let mut objs: Vec<Map<String, Value>> = vec![Map::new(); n];
    for (field, col) in batch.schema().fields().iter().zip(batch.columns()) {
        let values = to_json(col.as_ref())
            .map_err(|m| anyhow!("{}: column `{}`: {m}", path.display(), field.name()))?;
        for (row, v) in values.into_iter().enumerate() {
            match v {
                Err(()) => {
                    bad[row].get_or_insert_with(|| {
                        format!("{}: row {row}, column `{}`", path.display(), field.name())
                    });
                }
                Ok(v) => {
                    objs[row].insert(field.name().clone(), v);
                }
            }
        }
    }
    Ok(objs
        .into_iter()
        .zip(bad)
        .map(|(o, b)| {
            if let Some(w) = b {
                SourceRow::NonUtf8(w)
            } else {
                SourceRow::Ok(o)
            }
        })
        .collect())
}

/// JSON values of an Arrow array; `Err(())` marks a binary cell that is not UTF-8.
#[allow(clippy::result_unit_err)]
fn to_json(arr: &dyn Array) -> Result<Vec<Result<Value, ()>>, String> {
    let n = arr.len();
    // Each row: null where the array is, else the row's value.
    let rows = |value: &dyn Fn(usize) -> Value| -> Vec<Result<Value, ()>> {
        (0..n).map(|i| Ok(if arr.is_null(i) { Value::Null } else { value(i) })).collect()
    };
    macro_rules! prim {
        ($t:ty) => {{
            let a = arr.as_primitive::<$t>();
            rows(&|i| json!(a.value(i)))
        }};
    }
    Ok(match arr.data_type() {
        DataType::Null => vec![Ok(Value::Null); n],
        DataType::Boolean => {
            let a = arr.as_boolean();
            rows(&|i| Value::Bool(a.value(i)))
        }
        DataType::Int8 => prim!(Int8Type),
        DataType::Int16 => prim!(Int16Type),
        DataType::Int32 => prim!(Int32Type),
        DataType::Int64 => prim!(Int64Type),
        DataType::UInt8 => prim!(UInt8Type),
        DataType::UInt16 => prim!(UInt16Type),
        DataType::UInt32 => prim!(UInt32Type),
        DataType::UInt64 => prim!(UInt64Type),
        // As the f32 was written (0.1, not the f64 0.10000000149011612 it widens to).
        DataType::Float32 => {
            let a = arr.as_primitive::<Float32Type>();
            rows(&|i| a.value(i).to_string().parse::<f64>().map(|f| json!(f)).unwrap_or(Value::Null))
        }
        DataType::Float64 => prim!(Float64Type),
        DataType::Utf8 => {
            let a = arr.as_string::<i32>();
            rows(&|i| a.value(i).into())
        }
        DataType::LargeUtf8 => {
            let a = arr.as_string::<i64>();
            rows(&|i| a.value(i).into())
        }
        DataType::Utf8View => {
            let a = arr.as_string_view();
            rows(&|i| a.value(i).into())
        }
        DataType::Binary => binary_values(arr.as_binary::<i32>()),
        DataType::LargeBinary => binary_values(arr.as_binary::<i64>()),
        DataType::Struct(fields) => {
            let a = arr.as_struct();
            let mut out: Vec<Result<Value, ()>> =
                (0..n).map(|_| Ok(Value::Object(Map::new()))).collect();
            for (f, child) in fields.iter().zip(a.columns()) {
                for (i, v) in to_json(child.as_ref())?.into_iter().enumerate() {
                    match (v, &mut out[i]) {
                        (Ok(v), Ok(Value::Object(o))) => {
                            o.insert(f.name().clone(), v);
                        }
                        (Err(()), slot) => *slot = Err(()),
                        _ => {}
                    }
                }
            }
            (0..n)
                .map(|i| {
                    if a.is_null(i) {
                        Ok(Value::Null)
                    } else {
                        std::mem::replace(&mut out[i], Ok(Value::Null))
                    }
                })
                .collect()
        }
        DataType::List(_) | DataType::LargeList(_) => {
            let (values, offsets): (_, Vec<usize>) = match arr.data_type() {
                DataType::List(_) => {
                    let a = arr.as_list::<i32>();
                    (
                        a.values().clone(),
                        a.value_offsets().iter().map(|o| *o as usize).collect(),
                    )
                }
                _ => {
                    let a = arr.as_list::<i64>();
                    (
                        a.values().clone(),
                        a.value_offsets().iter().map(|o| *o as usize).collect(),
                    )
                }
            };
            let inner = to_json(values.as_ref())?;
            (0..n)
                .map(|i| {
                    if arr.is_null(i) {
                        return Ok(Value::Null);
                    }
                    inner[offsets[i]..offsets[i + 1]]
                        .iter()
                        .cloned()
                        .collect::<Result<Vec<Value>, ()>>()
                        .map(Value::Array)
                })
                .collect()
        }
        DataType::Dictionary(_, values) => {
            let plain = arrow::compute::cast(arr, values).map_err(|e| format!("reading a dictionary column: {e}"))?;
            to_json(plain.as_ref())?
        }
        // Timestamps, dates, decimals, ...: their text as Arrow prints it.
        _ => {
            let fmt = arrow::util::display::ArrayFormatter::try_new(arr, &Default::default())
                .map_err(|e| format!("unsupported Parquet type {}: {e}", arr.data_type()))?;
            rows(&|i| Value::String(fmt.value(i).to_string()))
        }
    })
}

/// Binary cells as UTF-8 strings; `Err(())` for one that is not UTF-8.
fn binary_values<O: OffsetSizeTrait>(a: &GenericBinaryArray<O>) -> Vec<Result<Value, ()>> {
    (0..a.len())
        .map(|i| {
            if a.is_null(i) {
                Ok(Value::Null)
            } else {
                std::str::from_utf8(a.value(i))
                    .map(|s| Value::String(s.to_string()))
                    .map_err(|_| ())
            }
        })
        .collect()
}

/// Dataset layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Verl,
    Hf,
    Gsm8k,
    Qa,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Verl => "verl",
            Layout::Hf => "hf",
            Layout::Gsm8k => "gsm8k",
            Layout::Qa => "qa",
        }
    }

    /// The layout named by the param, or guessed from the columns (and, for `question`/`answer`
    /// files, from whether any answer is a worked `… #### N`).
    pub fn pick(param: &str, columns: &BTreeSet<String>, rows: &[SourceRow], file: &Path) -> anyhow::Result<Layout> {
        Ok(match param {
            "verl" => Layout::Verl,
            "hf" => Layout::Hf,
            "gsm8k" => Layout::Gsm8k,
            "qa" => Layout::Qa,
            "auto" => {
                let has = |c: &str| columns.contains(c);
                if has("prompt") && has("reward_model") {
                    Layout::Verl
                } else if has("problem") {
                    Layout::Hf
                } else if has("question") && has("answer") {
                    let worked = rows.iter().any(|r| match r {
                        SourceRow::Ok(o) => cell_text(o.get("answer")).is_some_and(|a| a.contains("####")),
                        SourceRow::NonUtf8(_) => false,
                    });
                    if worked { Layout::Gsm8k } else { Layout::Qa }
                } else {
                    bail!(
                        "{}: cannot guess the layout from columns [{}]; set `layout` (verl|hf|gsm8k|qa) and the column params",
                        file.display(),
                        columns.iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                }
            }
            other => bail!("import: unknown layout `{other}` (expected auto, verl, hf, gsm8k or qa)"),
        })
    }
}

/// The `answer_col` prefix that reads the answer out of a column's last `\boxed{}`.
const BOXED: &str = "boxed:";

/// Which column holds what; `None` means absent.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub layout: Layout,
    pub prompt: String,
    pub solution: Option<String>,
    /// For `gsm8k`: the worked `… #### N` column.
    pub answer: Option<String>,
    /// `answer_col = "boxed:COL"`: the answer is the last `\boxed{}` of `answer` (= `COL`).
    pub answer_in_box: bool,
    pub id: Option<String>,
    /// verl only: the solution fallback (`extra_info.answer`).
    pub solution_fallback: Option<String>,
    /// The layout's default solution column, which a file may lack (not one named by a param).
    pub solution_optional: bool,
}

impl Mapping {
    /// Layout defaults, overridden by non-empty params (`none` = no such column).
    pub fn new(layout: Layout, prompt: &str, solution: &str, answer: &str, id: &str) -> Mapping {
        let pick = |param: &str, default: Option<&str>| -> Option<String> {
            match param {
                "" => default.map(str::to_string),
                "none" => None,
                p => Some(p.to_string()),
            }
        };
        let (p, s, a) = match layout {
            Layout::Verl => (
                "prompt",
                Some("extra_info.solution"),
                Some("reward_model.ground_truth"),
            ),
            Layout::Hf => ("problem", Some("solution"), Some("answer")),
            Layout::Gsm8k => ("question", None, Some("answer")),
            Layout::Qa => ("question", Some("solution"), Some("answer")),
        };
        let (answer, answer_in_box) = match answer.strip_prefix(BOXED) {
            Some(col) => (col, true),
            None => (answer, false),
        };
        Mapping {
            layout,
            prompt: pick(prompt, Some(p)).unwrap_or_else(|| p.to_string()),
            solution: pick(solution, s),
            answer: pick(answer, a),
            answer_in_box,
            id: pick(id, None),
            solution_fallback: (layout == Layout::Verl && solution.is_empty())
                .then(|| "extra_info.answer".to_string()),
            solution_optional: solution.is_empty(),
        }
    }

    /// The columns the file must have, by role. A layout's default solution column is optional:
    /// verl datasets and evaluation sets (AIME, Minerva) often lack it.
    fn required(&self) -> Vec<(&'static str, &String)> {
        let mut required: Vec<(&str, &String)> = vec![("prompt", &self.prompt)];
        if let Some(a) = &self.answer {
            required.push(("answer", a));
        }
        if let Some(s) = self.solution.as_ref().filter(|_| !self.solution_optional) {
            required.push(("solution", s));
        }
        if let Some(i) = &self.id {
            required.push(("id", i));
        }
        required
    }

    /// Every required column must exist in the file (its top-level part, for dotted paths).
    fn check(&self, columns: &BTreeSet<String>, file: &Path) -> anyhow::Result<()> {
        for (what, col) in self.required() {
            let top = top_level(col);
            if !columns.contains(top) {
                // A worked solution without an answer column (NuminaMath-CoT): say how to use it.
                let boxed_hint = match &self.solution {
                    Some(s) if what == "answer" && !self.answer_in_box && columns.contains(s.as_str()) => {
                        format!(", or `{BOXED}{s}` to take each answer from its solution's last \\boxed{{}}")
                    }
                    _ => String::new(),
                };
                bail!(
                    "{}: the {what} column `{col}` ({} layout) is not in the file (columns: {}); set `{what}_col` (or `none`){boxed_hint}",
                    file.display(),
                    self.layout.name(),
                    columns.iter().cloned().collect::<Vec<_>>().join(", ")
                );
            }
        }
        Ok(())
    }

    /// Every required nested column (`reward_model.ground_truth`) must be in the file's
    /// schema: present (null or not) in at least one row. Otherwise every row would import
    /// without it and nothing would say why.
    fn check_nested(&self, rows: &[SourceRow], file: &Path) -> anyhow::Result<()> {
        let objects = || {
            rows.iter().filter_map(|r| match r {
                SourceRow::Ok(o) => Some(o),
                SourceRow::NonUtf8(_) => None,
            })
        };
        for (what, col) in self.required().into_iter().filter(|(_, c)| c.contains('.')) {
            if objects().any(|o| get_path(o, col).is_some()) {
                continue;
            }
            let (parent, _) = col.rsplit_once('.').unwrap_or((col, ""));
            let fields: BTreeSet<String> = objects()
                .filter_map(|o| {
                    get_path(o, parent)?
                        .as_object()
                        .map(|m| m.keys().cloned().collect::<Vec<_>>())
                })
                .flatten()
                .collect();
            bail!(
                "{}: the {what} column `{col}` ({} layout) is not in the file's schema: `{parent}` has fields [{}]; set `{what}_col` (or `none`)",
                file.display(),
                self.layout.name(),
                fields.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
        Ok(())
    }

    /// Top-level columns consumed whole; parents of dotted paths (e.g. `extra_info`) stay in meta.
    fn top_level_used(&self) -> HashSet<String> {
        [
            Some(&self.prompt),
            self.solution.as_ref(),
            self.answer.as_ref(),
            self.id.as_ref(),
        ]
        .into_iter()
        .flatten()
        .filter(|c| !c.contains('.'))
        .cloned()
        .collect()
    }
}

/// The top-level column a column path (`reward_model.ground_truth`) lives in.
fn top_level(col: &str) -> &str {
    col.split('.').next().unwrap_or(col)
}

fn get_path<'a>(row: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut cur = row.get(parts.next()?)?;
    for p in parts {
        cur = cur.get(p)?;
    }
    Some(cur)
}

/// Text of a cell: strings as they are, numbers printed, null/empty as `None`, other JSON as JSON.
fn cell_text(v: Option<&Value>) -> Option<String> {
    let s = match v? {
        Value::Null => return None,
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    };
    (!s.trim().is_empty()).then_some(s)
}

/// A prompt cell: plain text, or chat messages kept as a JSON array of `{role, content}` (a
/// content of text parts as its text); `Ok(None)` without text to ask, `Err` naming a message
/// that has no role or no text content (it would otherwise be dropped from the prompt).
fn prompt_value(v: Option<&Value>) -> Result<Option<String>, String> {
    let Some(v) = v else { return Ok(None) };
    let Value::Array(msgs) = v else { return Ok(cell_text(Some(v))) };
    let mut clean = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).ok_or_else(|| format!("message {i} has no role"))?;
        let content = m
            .get("content")
            .and_then(message_content_text)
            .ok_or_else(|| format!("message {i} ({role}): its content is neither text nor a list of text parts"))?;
        clean.push(json!({"role": role, "content": content}));
    }
    let has_user_text = clean.iter().any(|m| m["role"] == "user" && !m["content"].as_str().unwrap_or("").trim().is_empty());
    Ok(has_user_text.then(|| Value::Array(clean).to_string()))
}

/// Split a GSM8K worked answer `… #### N` into (solution, answer).
pub fn split_gsm8k(worked: &str) -> (Option<String>, Option<String>) {
    match worked.rsplit_once("####") {
        Some((sol, ans)) => {
            let sol = sol.trim();
            let ans = ans.trim();
            (
                (!sol.is_empty()).then(|| sol.to_string()),
                (!ans.is_empty()).then(|| ans.to_string()),
            )
        }
        None => (
            (!worked.trim().is_empty()).then(|| worked.trim().to_string()),
            None,
        ),
    }
}

/// Import counters (skips and gaps), in the order they are reported.
#[derive(Debug, Default, PartialEq)]
pub struct ImportReport {
    pub rows_read: i64,
    pub skipped_non_utf8: i64,
    pub skipped_no_prompt: i64,
    /// Chat prompts with a message that has no role or no text content.
    pub skipped_bad_message: i64,
    pub missing_solution: i64,
    pub missing_answer: i64,
    /// Answers read out of a `\boxed{}` (`answer_col = "boxed:COL"`).
    pub answers_from_boxes: i64,
}

/// The answer a worked solution boxes (its last `\boxed{}`/`\fbox{}`, with the boxes that belong
/// to it), as the verifier extracts one from a response; `None` without a non-empty box.
fn boxed_answer(text: &str) -> Option<String> {
    crate::math::extract::boxed_group(text).filter(|a| !a.trim().is_empty())
}

/// Convert source rows into prompt rows; the rows skipped, with their reasons, come back too.
pub fn convert(
    file: &Path,
    rows: Vec<SourceRow>,
    columns: &BTreeSet<String>,
    m: &Mapping,
    source: &str,
) -> anyhow::Result<(Vec<PromptRow>, ImportReport, Vec<SkippedRow>)> {
    if m.answer_in_box && m.layout == Layout::Gsm8k {
        bail!(
            "{}: `answer_col = \"{BOXED}…\"` needs the hf or verl layout (a gsm8k answer is its `#### N`)",
            file.display()
        );
    }
    m.check(columns, file)?;
    m.check_nested(&rows, file)?;
    let mut skipped = Vec::new();
    let skip = |row: usize, reason: &str, detail: String| SkippedRow {
        stage: "import".into(),
        row: row as i64,
        id: None,
        reason: reason.into(),
        detail,
    };
    let used = m.top_level_used();
    let file_name = file
        .file_name()
        .map(|f| f.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut rep = ImportReport::default();
    let mut out = Vec::new();
    let mut ids: BTreeMap<String, usize> = BTreeMap::new();
    for (row_idx, r) in rows.into_iter().enumerate() {
        rep.rows_read += 1;
        let obj = match r {
            SourceRow::Ok(o) => o,
            SourceRow::NonUtf8(w) => {
                rep.skipped_non_utf8 += 1;
                skipped.push(skip(
                    row_idx,
                    "skipped_non_utf8",
                    format!("non-UTF-8 text at {w}"),
                ));
                continue;
            }
        };
        let prompt = match prompt_value(get_path(&obj, &m.prompt)) {
            Ok(p) => p,
            Err(why) => {
                rep.skipped_bad_message += 1;
                skipped.push(skip(row_idx, "skipped_bad_message", format!("{}: column `{}`: {why}", file.display(), m.prompt)));
                continue;
            }
        };
        let Some(prompt) = prompt else {
            rep.skipped_no_prompt += 1;
            let detail = format!(
                "{}: column `{}` is {}",
                file.display(),
                m.prompt,
                match get_path(&obj, &m.prompt) {
                    None | Some(Value::Null) => "missing".to_string(),
                    Some(v) => format!(
                        "empty ({})",
                        v.to_string().chars().take(80).collect::<String>()
                    ),
                }
            );
            skipped.push(skip(row_idx, "skipped_no_prompt", detail));
            continue;
        };
        let (solution, answer) = match m.layout {
            Layout::Gsm8k => match m.answer.as_ref().and_then(|a| cell_text(get_path(&obj, a))) {
                Some(worked) => split_gsm8k(&worked),
                None => (None, None),
            },
            _ => {
                let mut answer = m.answer.as_ref().and_then(|a| cell_text(get_path(&obj, a)));
                if m.answer_in_box {
                    answer = answer.as_deref().and_then(boxed_answer);
                    rep.answers_from_boxes += answer.is_some() as i64;
                }
                let mut solution = m
                    .solution
                    .as_ref()
                    .and_then(|s| cell_text(get_path(&obj, s)));
                if solution.is_none() {
                    if let Some(worked) = m
                        .solution_fallback
                        .as_ref()
                        .and_then(|s| cell_text(get_path(&obj, s)))
                        .filter(|w| w.contains("####"))
                    {
                        solution = split_gsm8k(&worked).0;
                    }
                }
                (solution, answer)
            }
        };
        rep.missing_solution += solution.is_none() as i64;
        rep.missing_answer += answer.is_none() as i64;
        let id = match &m.id {
            Some(c) => cell_text(get_path(&obj, c)).ok_or_else(|| {
                anyhow!(
                    "{}: row {row_idx}: id column `{c}` is empty",
                    file.display()
                )
            })?,
            None => format!("{source}-{row_idx:05}"),
        };
        if let Some(prev) = ids.insert(id.clone(), row_idx) {
            bail!(
                "{}: rows {prev} and {row_idx} share the id `{id}` (column `{}`)",
                file.display(),
                m.id.as_deref().unwrap_or("-")
            );
        }
        let row_source = match m.layout {
            Layout::Verl => cell_text(obj.get("data_source")).unwrap_or_else(|| source.to_string()),
            _ => source.to_string(),
        };
        let extra: Map<String, Value> =
            obj.into_iter().filter(|(k, _)| !used.contains(k)).collect();
        let meta =
            json!({"file": file_name, "row": row_idx, "layout": m.layout.name(), "extra": extra});
        out.push(PromptRow {
            id,
            prompt,
            answer,
            solution,
            source: row_source,
            meta: meta.to_string(),
        });
    }
    Ok((out, rep, skipped))
}

/// Stage `import`: input `source` (a file), output `prompts`.
/// The stage's params (stages/import.toml documents them); unknown or mistyped ones are errors naming
/// the stage and the param.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ImportParams {
    layout: String,
    prompt_col: String,
    solution_col: String,
    answer_col: String,
    id_col: String,
    source: String,
}

// Version 3: `qa` layout (auto: question/answer files without `####`); a default solution column
// may be absent. Version 4: numbers as written (f32 cells, JSON numbers a double would round),
// chat contents of text parts, Parquet types beyond JSON's as their text.
pub const STAGE: Builtin = Builtin { name: "import", version: "4", runs_in: Executable::Engine, run };

pub fn run(ctx: &mut StageContext) -> anyhow::Result<()> {
    let p: ImportParams = ctx.params()?;
    let path = ctx.input("source")?.to_path_buf();
    if !path.is_file() {
        bail!(
            "{}: import needs a single JSONL or Parquet file",
            path.display()
        );
    }
    let (rows, columns) = read_source(&path)?;
    let layout = Layout::pick(&p.layout, &columns, &rows, &path)?;
    let m = Mapping::new(layout, &p.prompt_col, &p.solution_col, &p.answer_col, &p.id_col);
    let source = p.source;
    let source = if source.is_empty() {
        path.file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_else(|| "import".into())
    } else {
        source
    };
    let (out, rep, skipped_rows) = convert(&path, rows, &columns, &m, &source)?;
    if let Some(s) = m.solution.as_ref().filter(|s| m.solution_optional && !columns.contains(top_level(s))) {
        eprintln!("import: {}: no `{s}` column ({} layout): no row has a reference solution (missing_solution {}; `filter` removes such rows, evaluation needs none)", path.display(), layout.name(), rep.missing_solution);
    }
    skipped::write(ctx, "import", &skipped_rows)?;
    ctx.count("rows_read", rep.rows_read);
    ctx.count("skipped_non_utf8", rep.skipped_non_utf8);
    ctx.count("skipped_no_prompt", rep.skipped_no_prompt);
    ctx.count("skipped_bad_message", rep.skipped_bad_message);
    ctx.count("missing_solution", rep.missing_solution);
    ctx.count("missing_answer", rep.missing_answer);
    if m.answer_in_box {
        ctx.count("answers_from_boxes", rep.answers_from_boxes);
    }
    ctx.metric("layout", layout.name());
    if out.is_empty() {
        bail!(
            "{}: no usable rows ({rep:?}); an empty dataset is not imported",
            path.display()
        );
    }
    write_rows(ctx.output("prompts")?, Schema::Prompts, &out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, BinaryArray, Int64Array, ListArray, StringArray, StructArray};
    use arrow::buffer::OffsetBuffer;
    use arrow::datatypes::{Field, Fields};

    use super::*;

    #[test]
    fn every_string_layout_boolean_and_number_cell_reads_as_json_with_its_nulls() {
        use arrow::array::{BooleanArray, LargeStringArray, StringViewArray};
        let cells = |a: &dyn Array| to_json(a).unwrap().into_iter().map(Result::unwrap).collect::<Vec<_>>();
        let want = vec![json!("a"), Value::Null, json!("ç")];
        assert_eq!(cells(&StringArray::from(vec![Some("a"), None, Some("ç")])), want);
        assert_eq!(cells(&LargeStringArray::from(vec![Some("a"), None, Some("ç")])), want);
        assert_eq!(cells(&StringViewArray::from(vec![Some("a"), None, Some("ç")])), want);
        assert_eq!(cells(&BooleanArray::from(vec![None, Some(true)])), vec![Value::Null, json!(true)]);
        assert_eq!(cells(&Int64Array::from(vec![Some(-3), None])), vec![json!(-3), Value::Null]);
    }

    fn import(
        path: &Path,
        layout: &str,
        cols: [&str; 4],
    ) -> anyhow::Result<(Vec<PromptRow>, ImportReport)> {
        import_all(path, layout, cols).map(|(rows, rep, _)| (rows, rep))
    }

    fn import_all(
        path: &Path,
        layout: &str,
        cols: [&str; 4],
    ) -> anyhow::Result<(Vec<PromptRow>, ImportReport, Vec<SkippedRow>)> {
        let (rows, columns) = read_source(path)?;
        let l = Layout::pick(layout, &columns, &rows, path)?;
        let m = Mapping::new(l, cols[0], cols[1], cols[2], cols[3]);
        convert(path, rows, &columns, &m, "test")
    }

    // Issue 18: this file used to import "successfully" with missing_answer = 2.
    #[test]
    fn a_verl_file_without_ground_truth_fails_naming_file_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("no_gt.jsonl");
        let row = |q: &str| {
            json!({"prompt": [{"role": "user", "content": q}], "reward_model": {"style": "rule"}, "data_source": "x"})
                .to_string()
        };
        std::fs::write(&p, format!("{}\n{}\n", row("1+1?"), row("2+2?"))).unwrap();
        let err = import(&p, "auto", ["", "", "", ""])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no_gt.jsonl")
                && err.contains("`reward_model.ground_truth`")
                && err.contains("[style]"),
            "{err}"
        );
        // One row with the field (even null) puts it in the schema.
        let with = json!({"prompt": [{"role": "user", "content": "3+3?"}], "reward_model": {"style": "rule", "ground_truth": null}});
        std::fs::write(&p, format!("{}\n{with}\n", row("1+1?"))).unwrap();
        let (rows, rep) = import(&p, "auto", ["", "", "", ""]).unwrap();
        assert_eq!((rows.len(), rep.missing_answer), (2, 2));
    }

    fn data(rel: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data").join(rel)
    }

    #[test]
    fn gsm8k_fixture_imports_every_row_with_its_marker_answer() {
        let (rows, rep) = import(
            &data("gsm8k-mgs/gsm8k-mgs-eng.jsonl"),
            "auto",
            ["", "", "", ""],
        )
        .unwrap();
        assert_eq!(rows.len(), 100);
        assert_eq!(
            rep,
            ImportReport {
                rows_read: 100,
                ..Default::default()
            }
        );
        let first = &rows[0];
        assert!(first.prompt.starts_with("Benny saw a 10-foot shark"));
        assert_eq!(first.answer.as_deref(), Some("10"));
        let sol = first.solution.as_deref().unwrap();
        assert!(
            sol.starts_with("First, find") && sol.ends_with("= 10%"),
            "{sol}"
        );
        assert!(!sol.contains("####"));
        let meta: Value = serde_json::from_str(&first.meta).unwrap();
        assert_eq!(meta["extra"]["id_orig"], 473);
        assert_eq!(meta["layout"], "gsm8k");
        assert_eq!(first.id, "test-00000");
    }

    #[test]
    fn verl_fixture_keeps_chat_prompts_and_ground_truth() {
        let (rows, rep) = import(&data("layouts/verl.jsonl"), "auto", ["", "", "", ""]).unwrap();
        assert_eq!(rows.len(), 3);
        let msgs: Value = serde_json::from_str(&rows[0].prompt).unwrap();
        assert_eq!(msgs[1]["role"], "user");
        assert_eq!(rows[0].answer.as_deref(), Some("72"));
        assert_eq!(rows[0].source, "openai/gsm8k");
        // extra_info.answer (worked, with ####) is the solution fallback; a numeric ground truth
        // is printed as text; a row without either has no solution.
        assert!(rows[0]
            .solution
            .as_deref()
            .unwrap()
            .ends_with("72 clips altogether in April and May."));
        assert_eq!(rows[1].answer.as_deref(), Some("10"));
        assert_eq!(
            rows[1].solution.as_deref(),
            Some("Half of 20 is 10.\nThe answer is 10.")
        );
        assert_eq!(rows[2].solution, None);
        assert_eq!(rep.missing_solution, 1);
        let meta: Value = serde_json::from_str(&rows[0].meta).unwrap();
        assert_eq!(meta["extra"]["extra_info"]["index"], 0);
    }

    #[test]
    fn hf_fixture_and_explicit_columns() {
        let (rows, rep) = import(&data("layouts/hf.jsonl"), "auto", ["", "", "", ""]).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].answer.as_deref(), Some("\\frac{1}{2}"));
        assert_eq!(rep.missing_answer, 1);
        // Explicit mapping: id column and no solution column.
        let (rows, rep) = import(&data("layouts/hf.jsonl"), "hf", ["", "none", "", "uid"]).unwrap();
        assert_eq!(rows[1].id, "b");
        assert!(rows.iter().all(|r| r.solution.is_none()));
        assert_eq!(rep.missing_solution, 3);
    }

    #[test]
    fn evaluation_sets_without_solutions_import_in_their_own_layouts() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, lines: &[Value]| {
            let p = dir.path().join(name);
            std::fs::write(&p, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
            p
        };
        // AIME as several hubs ship it: problem and answer, no worked solution.
        let aime = write("aime.jsonl", &[json!({"id": 60, "problem": "Find $x$.", "answer": "204"})]);
        let (rows, rep) = import(&aime, "auto", ["", "", "", ""]).unwrap();
        assert_eq!((rows[0].prompt.as_str(), rows[0].answer.as_deref(), rows[0].solution.as_deref()), ("Find $x$.", Some("204"), None));
        assert_eq!((rep.missing_solution, rep.missing_answer), (1, 0));
        // Minerva-Math: question and a final answer (no `#### N`): the qa layout, not gsm8k's.
        let minerva = write("minerva.jsonl", &[json!({"question": "Q1", "answer": "2.5 \\times 10^{3}"}), json!({"question": "Q2", "answer": "7"})]);
        let (rows, rep) = import(&minerva, "auto", ["", "", "", ""]).unwrap();
        let got: Vec<(&str, Option<&str>)> = rows.iter().map(|r| (r.prompt.as_str(), r.answer.as_deref())).collect();
        assert_eq!(got, [("Q1", Some("2.5 \\times 10^{3}")), ("Q2", Some("7"))]);
        assert_eq!(rep.missing_answer, 0);
        let meta: Value = serde_json::from_str(&rows[0].meta).unwrap();
        assert_eq!(meta["layout"], "qa");
        // One worked `#### N` answer makes it GSM8K's layout.
        let gsm = write("gsm.jsonl", &[json!({"question": "Q1", "answer": "1+1=2\n#### 2"}), json!({"question": "Q2", "answer": "7"})]);
        let (rows, _) = import(&gsm, "auto", ["", "", "", ""]).unwrap();
        assert_eq!((rows[0].answer.as_deref(), rows[0].solution.as_deref(), rows[1].answer.as_deref()), (Some("2"), Some("1+1=2"), None));
        // A solution column the params name must exist.
        let err = import(&aime, "auto", ["", "worked", "", ""]).unwrap_err().to_string();
        assert!(err.contains("aime.jsonl") && err.contains("the solution column `worked`"), "{err}");
    }

    #[test]
    fn answers_come_out_of_a_worked_solutions_last_box() {
        // NuminaMath-CoT's layout: worked solutions, no answer column.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("numina.jsonl");
        let rows = [
            json!({"source": "olympiads", "problem": "p0", "solution": "So $x = \\boxed{\\frac{1}{2}}$.", "messages": []}),
            json!({"source": "amc", "problem": "p1", "solution": "The roots are $\\boxed{1}$ and $\\boxed{-2}$.", "messages": []}),
            json!({"source": "cn_k12", "problem": "p2", "solution": "The answer is 7.", "messages": []}),
            json!({"source": "aops", "problem": "p3", "solution": "First \\boxed{3}, then $\\boxed{\\sqrt{2}+{3}}$", "messages": []}),
            json!({"source": "aops", "problem": "p4", "solution": "Within \\boxed{}.", "messages": []}),
        ];
        std::fs::write(&p, rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
        let err = import(&p, "auto", ["", "", "", ""]).unwrap_err().to_string();
        assert!(err.contains("numina.jsonl") && err.contains("`answer`") && err.contains("`boxed:solution`"), "{err}");

        let (out, rep) = import(&p, "auto", ["", "", "boxed:solution", ""]).unwrap();
        let answers: Vec<Option<&str>> = out.iter().map(|r| r.answer.as_deref()).collect();
        assert_eq!(answers, [Some("\\frac{1}{2}"), Some("1,-2"), None, Some("\\sqrt{2}+{3}"), None]);
        assert_eq!((rep.answers_from_boxes, rep.missing_answer, rep.missing_solution), (3, 2, 0));
        // The solution stays whole, and the file's own `source` column is kept in meta.
        assert_eq!(out[0].solution.as_deref(), Some("So $x = \\boxed{\\frac{1}{2}}$."));
        let meta: Value = serde_json::from_str(&out[1].meta).unwrap();
        assert_eq!(meta["extra"]["source"], "amc");

        let err = import(&p, "auto", ["", "", "boxed:worked", ""]).unwrap_err().to_string();
        assert!(err.contains("the answer column `worked`"), "{err}");
        let gsm = dir.path().join("gsm.jsonl");
        std::fs::write(&gsm, "{\"question\": \"q\", \"answer\": \"1 #### 1\"}\n").unwrap();
        let err = import(&gsm, "gsm8k", ["", "", "boxed:answer", ""]).unwrap_err().to_string();
        assert!(err.contains("needs the hf or verl layout"), "{err}");
    }

    #[test]
    fn mapping_a_missing_column_names_file_and_column() {
        let err = import(&data("layouts/hf.jsonl"), "hf", ["", "", "final", ""])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("hf.jsonl") && err.contains("`final`") && err.contains("problem"),
            "{err}"
        );
        let err = import(
            &data("gsm8k-mgs/gsm8k-mgs-eng.jsonl"),
            "verl",
            ["", "", "", ""],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("`prompt`"), "{err}");
    }

    #[test]
    fn bad_rows_are_counted_and_bad_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.jsonl");
        let mut bytes = br#"{"question": "What is 1+1?", "answer": "1+1=2\n#### 2"}"#.to_vec();
        bytes.extend_from_slice(b"\n{\"question\": \"caf\xe9?\", \"answer\": \"#### 1\"}\n");
        bytes.extend_from_slice(b"{\"question\": \"\", \"answer\": \"#### 3\"}\n");
        bytes.extend_from_slice(b"{\"question\": \"No marker\", \"answer\": \"just text\"}\n\n");
        bytes.extend_from_slice(b"{\"question\": \"Empty\", \"answer\": null}\n");
        std::fs::write(&p, &bytes).unwrap();
        let (rows, rep, skipped) = import_all(&p, "gsm8k", ["", "", "", ""]).unwrap();
        // Every skipped row is named with its reason.
        let named: Vec<(i64, &str)> = skipped.iter().map(|s| (s.row, s.reason.as_str())).collect();
        assert_eq!(
            named,
            vec![(1, "skipped_non_utf8"), (2, "skipped_no_prompt")]
        );
        assert!(
            skipped[1].detail.contains("bad.jsonl")
                && skipped[1].detail.contains("`question` is empty"),
            "{:?}",
            skipped[1]
        );
        assert_eq!(
            rep,
            ImportReport {
                rows_read: 5,
                skipped_non_utf8: 1,
                skipped_no_prompt: 1,
                skipped_bad_message: 0,
                missing_solution: 1,
                missing_answer: 2,
                answers_from_boxes: 0
            }
        );
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1].solution.as_deref(), Some("just text"));
        assert_eq!(rows[1].answer, None);

        std::fs::write(&p, "{\"question\": \"q\", \"answer\": \"a\"}\n{oops\n").unwrap();
        let err = import(&p, "gsm8k", ["", "", "", ""])
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad.jsonl: line 2: invalid JSON"), "{err}");
        let arr = dir.path().join("arr.json");
        std::fs::write(
            &arr,
            "[\n {\"problem\": \"p\", \"solution\": \"s 1\", \"answer\": 1}\n]\n",
        )
        .unwrap();
        let (rows, _) = import(&arr, "auto", ["", "", "", ""]).unwrap();
        assert_eq!(rows[0].answer.as_deref(), Some("1"));
        let csv = dir.path().join("x.csv");
        std::fs::write(&csv, "a,b\n").unwrap();
        assert!(import(&csv, "auto", ["", "", "", ""])
            .unwrap_err()
            .to_string()
            .contains("unknown dataset format"));
    }

    /// A verl-style Parquet file: `prompt` list<struct<role, content>>, `reward_model` struct,
    /// a binary column with one non-UTF-8 cell.
    #[test]
    fn verl_parquet_with_nested_columns() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("verl.parquet");
        let msg_fields = Fields::from(vec![
            Field::new("role", DataType::Utf8, false),
            Field::new("content", DataType::Utf8, false),
        ]);
        let msgs = StructArray::new(
            msg_fields.clone(),
            vec![
                Arc::new(StringArray::from(vec!["user", "user"])) as ArrayRef,
                Arc::new(StringArray::from(vec!["What is 6*7?", "What is 2+2?"])),
            ],
            None,
        );
        let prompt = ListArray::new(
            Arc::new(Field::new("item", DataType::Struct(msg_fields), false)),
            OffsetBuffer::from_lengths([1, 1]),
            Arc::new(msgs),
            None,
        );
        let rm_fields = Fields::from(vec![
            Field::new("ground_truth", DataType::Utf8, false),
            Field::new("style", DataType::Utf8, false),
        ]);
        let rm = StructArray::new(
            rm_fields,
            vec![
                Arc::new(StringArray::from(vec!["42", "4"])) as ArrayRef,
                Arc::new(StringArray::from(vec!["rule", "rule"])),
            ],
            None,
        );
        let note = BinaryArray::from(vec![b"ok".as_ref(), b"\xff\xfe".as_ref()]);
        let idx = Int64Array::from(vec![7, 8]);
        let batch = RecordBatch::try_from_iter(vec![
            ("prompt", Arc::new(prompt) as ArrayRef),
            ("reward_model", Arc::new(rm) as ArrayRef),
            ("note", Arc::new(note) as ArrayRef),
            ("index", Arc::new(idx) as ArrayRef),
        ])
        .unwrap();
        crate::artifact::write_batch(&p, &batch).unwrap();
        let (rows, rep) = import(&p, "auto", ["", "", "", "index"]).unwrap();
        assert_eq!(rep.skipped_non_utf8, 1);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].id, "7");
        assert_eq!(rows[0].answer.as_deref(), Some("42"));
        assert_eq!(
            rows[0].prompt,
            r#"[{"content":"What is 6*7?","role":"user"}]"#
        );
        let meta: Value = serde_json::from_str(&rows[0].meta).unwrap();
        assert_eq!(meta["extra"]["note"], "ok");
    }

    /// Answers as the file writes them: an f32 cell is not widened to its f64 digits, a JSON
    /// integer too long for 64 bits or a fraction with more digits than a double keeps stays its
    /// text; numbers a double holds read as before.
    #[test]
    fn numbers_keep_every_digit_the_file_writes() {
        use arrow::array::Float32Array;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f32.parquet");
        let batch = RecordBatch::try_from_iter(vec![
            ("problem", Arc::new(StringArray::from(vec!["a?", "b?", "c?"])) as ArrayRef),
            ("solution", Arc::new(StringArray::from(vec!["s", "s", "s"])) as ArrayRef),
            ("answer", Arc::new(Float32Array::from(vec![0.1, 3.3, 1234.567])) as ArrayRef),
        ])
        .unwrap();
        crate::artifact::write_batch(&p, &batch).unwrap();
        let (rows, _) = import(&p, "hf", ["", "", "", ""]).unwrap();
        let answers: Vec<_> = rows.iter().map(|r| r.answer.as_deref().unwrap()).collect();
        assert_eq!(answers, ["0.1", "3.3", "1234.567"]);

        let p = dir.path().join("big.jsonl");
        let lines = [
            "12345678901234567890123",
            "-98765432109876543210",
            "3.14159265358979323846",
            "0.1",
            "5",
            "2.5e3",
            "18446744073709551615",
        ];
        let body: String = lines.iter().map(|a| format!("{{\"problem\": \"p{a}\", \"solution\": \"s\", \"answer\": {a}, \"extra\": {{\"n\": [{a}]}}}}\n")).collect();
        std::fs::write(&p, body).unwrap();
        let (rows, _) = import(&p, "hf", ["", "", "", ""]).unwrap();
        let answers: Vec<_> = rows.iter().map(|r| r.answer.clone().unwrap()).collect();
        assert_eq!(answers, ["12345678901234567890123", "-98765432109876543210", "3.14159265358979323846", "0.1", "5", "2500.0", "18446744073709551615"]);
        // Nested numbers too (they go into meta).
        let meta: Value = serde_json::from_str(&rows[0].meta).unwrap();
        assert_eq!(meta["extra"]["extra"]["n"][0], "12345678901234567890123");
        assert!(!number_is_exact("1.0000000000000001", &json!(1.0)));
        assert!(number_is_exact("0.000000000000001", &json!(1e-15)));
    }

    /// OpenAI-style content parts are the message's text; a message without text is a listed
    /// skip, never a message dropped from the prompt.
    #[test]
    fn chat_contents_of_text_parts_are_kept_and_other_parts_are_listed_skips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("parts.jsonl");
        let row = |prompt: Value| json!({"prompt": prompt, "reward_model": {"ground_truth": "4"}, "data_source": "d"}).to_string();
        let rows = [
            row(json!([{"role": "system", "content": [{"type": "text", "text": "You are careful."}]}, {"role": "user", "content": "What is 2+2?"}])),
            row(json!([{"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "3+1?"}]}])),
            row(json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])),
            row(json!([{"content": "no role"}])),
        ];
        std::fs::write(&p, rows.join("\n")).unwrap();
        let (out, rep, skipped) = import_all(&p, "auto", ["", "", "", ""]).unwrap();
        assert_eq!(out[0].prompt, r#"[{"content":"You are careful.","role":"system"},{"content":"What is 2+2?","role":"user"}]"#);
        assert_eq!(out[1].prompt, r#"[{"content":"What is 3+1?","role":"user"}]"#);
        assert_eq!((out.len(), rep.skipped_bad_message), (2, 2));
        let named: Vec<_> = skipped.iter().map(|s| (s.row, s.reason.as_str())).collect();
        assert_eq!(named, [(2, "skipped_bad_message"), (3, "skipped_bad_message")]);
        assert!(skipped[0].detail.contains("parts.jsonl") && skipped[0].detail.contains("message 0 (user)"), "{:?}", skipped[0]);
        assert!(skipped[1].detail.contains("message 0 has no role"), "{:?}", skipped[1]);
    }

    /// A byte-order mark is not part of the first row; a JSON object over several lines is an
    /// error that says what is expected.
    #[test]
    fn a_byte_order_mark_is_skipped_and_a_multi_line_object_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bom.jsonl");
        std::fs::write(&p, "\u{feff}{\"question\": \"q\", \"answer\": \"1 #### 1\"}\n").unwrap();
        let (rows, _) = import(&p, "auto", ["", "", "", ""]).unwrap();
        assert_eq!(rows[0].answer.as_deref(), Some("1"));
        std::fs::write(&p, "{\n  \"question\": \"q\",\n  \"answer\": \"1 #### 1\"\n}\n").unwrap();
        let err = import(&p, "auto", ["", "", "", ""]).unwrap_err().to_string();
        assert!(err.contains("bom.jsonl: line 1: invalid JSON") && err.contains("one JSON object per line"), "{err}");
    }

    /// Columns of types JSON lacks (a timestamp, a pandas categorical) do not stop an import:
    /// they go into meta as their text.
    #[test]
    fn parquet_columns_of_other_types_read_as_their_text() {
        use arrow::array::{DictionaryArray, TimestampMicrosecondArray};
        use arrow::datatypes::Int8Type;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ts.parquet");
        let cat: DictionaryArray<Int8Type> = vec!["easy", "hard"].into_iter().collect();
        let batch = RecordBatch::try_from_iter(vec![
            ("question", Arc::new(StringArray::from(vec!["a?", "b?"])) as ArrayRef),
            ("answer", Arc::new(StringArray::from(vec!["x #### 1", "y #### 2"])) as ArrayRef),
            ("created", Arc::new(TimestampMicrosecondArray::from(vec![0, 86_400_000_000])) as ArrayRef),
            ("level", Arc::new(cat) as ArrayRef),
        ])
        .unwrap();
        crate::artifact::write_batch(&p, &batch).unwrap();
        let (rows, _) = import(&p, "auto", ["", "", "", ""]).unwrap();
        let meta: Value = serde_json::from_str(&rows[1].meta).unwrap();
        assert_eq!(meta["extra"]["created"], "1970-01-02T00:00:00");
        assert_eq!(meta["extra"]["level"], "hard");
    }
}
