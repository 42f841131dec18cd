//! σ-scoring benchmark (see bench/scoring.sh): for one model, one process per mode so each
//! reports its own peak RSS.
//!
//! - `generate`: samples one rollout of TOKENS new tokens (seeded, no early stop), times it and
//!   writes the trace to TRACE.
//! - `kv` / `naive`: reads TRACE, cuts it into SEGMENTS segments with the `entropy` segmentation
//!   and scores R_t and v_t at every cut with the KV-shared scorer or the naive oracle (one
//!   prefill per cut and target); writes the values so the script can compare them.
//!
//! Each process installs rredcot-worker's caching CPU allocator first, as the stages run
//! (`RREDCOT_CPU_CACHE_MB=0`: libtorch's own); OUT_JSON says which one ran.
//!
//! usage: bench_scoring MODEL MODE TRACE OUT_JSON THREADS TOKENS SEGMENTS

use std::path::Path;
use std::time::Instant;

use rredcot::credit::segmentation::{self, Method, Params};
use rredcot_ml::cpu_cache;
use rredcot_ml::model::{self, ChatMessage, LoadOptions, SamplingParams};

const QUESTION: &str = "Tom has 17 boxes with 23 apples each. He gives away 5 boxes. How many apples does he have left?";
const SOLUTION: &str = "Start with 17 boxes.\nGive away 5: 17 - 5 = 12.\nEach box has 23 apples: 12 * 23 = 276.\nThe answer is 276.";
const ANSWER: &str = "The answer is 276.";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, model_path, mode, trace_path, out, threads, tokens, segments] = args.as_slice() else {
        anyhow::bail!("usage: bench_scoring MODEL MODE TRACE OUT_JSON THREADS TOKENS SEGMENTS");
    };
    // Before the first tensor, as rredcot-worker does.
    let allocator = cpu_cache::install_from_env().map_err(anyhow::Error::msg)?.allocator();
    tch::set_num_threads(threads.parse()?);
    let opts = LoadOptions { device: model::DeviceChoice::Cpu, dtype: model::DtypeChoice::F32 };
    let loaded = model::load(Path::new(model_path), &opts)?;
    let (m, tok) = (&loaded.model, loaded.tokenizer.as_ref().expect("tokenizer"));
    let prompt = tok.encode_chat(&[ChatMessage::new("user", QUESTION)], true)?;
    let result = match mode.as_str() {
        "generate" => {
            let n: usize = tokens.parse()?;
            let n = n.min(m.cfg.max_position_embeddings as usize - prompt.len() - 64);
            let p = SamplingParams { temperature: 1.0, max_new_tokens: n, ..SamplingParams::default() };
            let t0 = Instant::now();
            // No tokenizer: no EOS stop, so the trace has exactly `n` tokens.
            let g = tch::no_grad(|| model::generate(m, None, std::slice::from_ref(&prompt), &[0], &p))?.remove(0);
            let secs = t0.elapsed().as_secs_f64();
            std::fs::write(
                trace_path,
                serde_json::to_string(&serde_json::json!({ "tokens": g.tokens, "entropies": g.entropies }))?,
            )?;
            serde_json::json!({ "generate_s": secs, "trace_tokens": g.tokens.len() })
        }
        "kv" | "naive" => {
            let trace: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(trace_path)?)?;
            let completion: Vec<i64> = serde_json::from_value(trace["tokens"].clone())?;
            let entropies: Vec<f32> = serde_json::from_value(trace["entropies"].clone())?;
            let texts: Vec<String> = completion.iter().map(|&t| tok.decode(&[t], false)).collect::<Result<_, _>>()?;
            let params = Params { method: Method::Entropy, keywords: vec![], max_segments: segments.parse()?, homogenize: false };
            let cuts = segmentation::segment(&texts, &entropies, &params);
            let full: Vec<i64> = prompt.iter().chain(&completion).copied().collect();
            let at: Vec<usize> = std::iter::once(prompt.len())
                .chain(cuts.iter().map(|c| prompt.len() + c))
                .chain(std::iter::once(full.len()))
                .collect();
            let targets = vec![tok.encode(ANSWER)?, tok.encode(SOLUTION)?];
            let t0 = Instant::now();
            let values = if mode == "kv" {
                model::score_cuts(m, &full, &at, &targets)?
            } else {
                model::score_cuts_naive(m, &full, &at, &targets)?
            };
            let secs = t0.elapsed().as_secs_f64();
            serde_json::json!({
                "score_s": secs,
                "segments": at.len() - 1,
                "trace_tokens": full.len(),
                "target_tokens": [targets[0].len(), targets[1].len()],
                "values": values,
            })
        }
        other => anyhow::bail!("unknown mode {other}"),
    };
    let mut result = result;
    result["peak_rss_mb"] = rredcot::engine::exec::peak_rss_mb().into();
    result["cpu_allocator"] = allocator.into();
    std::fs::write(out, serde_json::to_string_pretty(&result)?)?;
    Ok(())
}
