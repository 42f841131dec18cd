//! Typed rows of the tabular artifacts; field names are the Parquet column names.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptRow {
    pub id: String,
    /// Plain text, or chat messages as a JSON array of `{role, content}`.
    pub prompt: String,
    /// Reference answer y*.
    pub answer: Option<String>,
    /// Reference solution u*.
    pub solution: Option<String>,
    pub source: String,
    /// Free-form JSON object (difficulty, split, original columns...).
    pub meta: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutRow {
    pub prompt_id: String,
    pub sample_idx: i32,
    pub completion_ids: Vec<i32>,
    pub text: String,
    pub logprobs: Vec<f32>,
    pub entropies: Vec<f32>,
    pub answer_extracted: Option<String>,
    pub reward: f64,
    pub finish_reason: String,
    pub policy_ckpt: String,
    /// Where the chain of thought ends in `completion_ids` (exclusive): the index after the
    /// end-of-thinking token (`</think>`) of a thinking model, else the first token of the final
    /// answer's sentence (the verifier's extraction; `credit::thinking::answer_start`). `None`: the thinking never closed (or no answer
    /// line was found); `0`: no chain of thought, the answer starts the completion. Credit
    /// assignment covers `0..cot_end` only; see [`crate::credit::thinking`].
    pub cot_end: Option<i32>,
}

impl RolloutRow {
    /// Tokens of the chain of thought: `cot_end`, or the whole completion when it never closed.
    pub fn cot_len(&self) -> usize {
        self.cot_end.map_or(self.completion_ids.len(), |c| (c.max(0) as usize).min(self.completion_ids.len()))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentRow {
    pub prompt_id: String,
    pub sample_idx: i32,
    pub seg_starts: Vec<i32>,
    pub seg_ends: Vec<i32>,
    pub method: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreRow {
    pub prompt_id: String,
    pub sample_idx: i32,
    /// R_t = log p(y* | x, u_1..u_t), t = 0..T.
    #[serde(rename = "R")]
    pub r: Vec<f64>,
    /// v_t = log p(u* | x, u_1..u_t), t = 0..T.
    pub v: Vec<f64>,
    /// Per-segment credit σ_1..σ_T.
    pub sigma: Vec<f64>,
    pub method: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRow {
    pub prompt_id: String,
    pub benchmark: String,
    pub sample_idx: i32,
    /// The problem as posed (the prompt's text), so a judge needs no other input.
    pub question: String,
    /// Reference answer y* (None when the benchmark has none: counted wrong by the verifier).
    pub reference: Option<String>,
    pub text: String,
    /// Answer extracted from `text` by the verifier (None: unparseable, counted wrong).
    pub answer: Option<String>,
    pub correct_verifier: bool,
    pub correct_judge: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::{read_rows, write_rows, Schema};

    fn rollout(i: i32) -> RolloutRow {
        RolloutRow {
            prompt_id: format!("p{i}"),
            sample_idx: i,
            completion_ids: vec![1, 2, i],
            text: "x".into(),
            logprobs: vec![-0.5, -1.0, -2.0],
            entropies: vec![0.1, 0.2, 0.3],
            answer_extracted: if i % 2 == 0 { Some("4".into()) } else { None },
            reward: 1.0,
            finish_reason: "stop".into(),
            policy_ckpt: "abc".into(),
            cot_end: if i % 3 == 0 { None } else { Some(2) },
        }
    }

    #[test]
    fn rows_roundtrip_and_bytes_are_deterministic() {
        let dir = tempfile::tempdir().unwrap();
        let rows: Vec<RolloutRow> = (0..5).map(rollout).collect();
        let a = dir.path().join("a.parquet");
        let b = dir.path().join("b.parquet");
        write_rows(&a, Schema::Rollouts, &rows).unwrap();
        write_rows(&b, Schema::Rollouts, &rows).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let back: Vec<RolloutRow> = read_rows(&a, Schema::Rollouts).unwrap();
        assert_eq!(back, rows);
    }

    #[test]
    fn missing_column_error_names_file_column_and_type() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.parquet");
        let rows = vec![SegmentRow { prompt_id: "p".into(), sample_idx: 0, seg_starts: vec![0], seg_ends: vec![3], method: "m".into() }];
        write_rows(&p, Schema::Segments, &rows).unwrap();
        let err = read_rows::<ScoreRow>(&p, Schema::Scores).unwrap_err().to_string();
        assert!(err.contains("s.parquet"), "{err}");
        assert!(err.contains("missing column `R`"), "{err}");
        assert!(err.contains("List"), "{err}");
    }

    #[test]
    fn wrong_column_type_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e.parquet");
        // `sample_idx` written as a string column: not castable to int32 by contract.
        let rows = vec![PromptRow { id: "1".into(), prompt: "q".into(), answer: None, solution: None, source: "s".into(), meta: "{}".into() }];
        write_rows(&p, Schema::Prompts, &rows).unwrap();
        let batch = crate::artifact::read_batches(&p).unwrap();
        let renamed = arrow::array::RecordBatch::try_new(
            std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
                arrow::datatypes::Field::new("prompt_id", arrow::datatypes::DataType::Utf8, false),
                arrow::datatypes::Field::new("sample_idx", arrow::datatypes::DataType::Utf8, false),
            ])),
            vec![batch.column(0).clone(), batch.column(1).clone()],
        )
        .unwrap();
        crate::artifact::write_batch(&p, &renamed).unwrap();
        let err = crate::artifact::validate_file(&p, Schema::Segments).unwrap_err().to_string();
        assert!(err.contains("column `sample_idx` has type Utf8, expected Int32"), "{err}");
    }
}

#[cfg(test)]
mod value_tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field};

    use super::*;
    use crate::artifact::{read_batches, validate_file, write_batch, write_rows, Schema};

    /// A value that does not fit the contract's type is an error naming it, not a null (the
    /// safe cast made 5e9 in an int32 column read as "null where a value is required").
    #[test]
    fn a_value_too_large_for_its_column_is_named_not_read_as_null() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg.parquet");
        let rows = vec![SegmentRow { prompt_id: "p".into(), sample_idx: 0, seg_starts: vec![0], seg_ends: vec![3], method: "m".into() }; 2];
        write_rows(&p, Schema::Segments, &rows).unwrap();
        let batch = read_batches(&p).unwrap();
        let idx = batch.schema().index_of("sample_idx").unwrap();
        let mut fields: Vec<_> = batch.schema().fields().iter().cloned().collect();
        let mut cols = batch.columns().to_vec();
        fields[idx] = Arc::new(Field::new("sample_idx", DataType::Int64, false));
        cols[idx] = Arc::new(Int64Array::from(vec![1, 5_000_000_000]));
        write_batch(&p, &RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), cols).unwrap()).unwrap();
        let err = validate_file(&p, Schema::Segments).unwrap_err().to_string();
        assert!(err.contains("column `sample_idx`") && err.contains("5000000000"), "{err}");
        assert!(!err.contains("null"), "{err}");
    }

    /// NaN or an infinity in a return, value or σ is refused where it is written, naming the
    /// column and row.
    #[test]
    fn scores_and_rewards_must_be_finite() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sc.parquet");
        let row = |r: Vec<f64>| ScoreRow { prompt_id: "p".into(), sample_idx: 0, r, v: vec![0.0, 0.0], sigma: vec![0.5, 0.5], method: "m".into() };
        write_rows(&p, Schema::Scores, &[row(vec![0.0, 1.0])]).unwrap();
        for bad in [f64::NAN, f64::INFINITY] {
            let err = write_rows(&p, Schema::Scores, &[row(vec![0.0, 1.0]), row(vec![0.0, bad])]).unwrap_err().to_string();
            assert!(err.contains(&format!("column `R` row 1: {bad} where schema `scores` needs a finite number")), "{err}");
        }
    }
}
