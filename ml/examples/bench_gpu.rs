//! Our half of bench/gpu.sh (issue 17): decode tokens/s of a DeepSeek-R1-Distill-Qwen-1.5B-shaped
//! model (Qwen2, hidden 1536, 28 layers, 12 q / 2 kv heads, vocab 151936, random weights) on CUDA
//! in bfloat16, 64-token prompt, 128 new tokens sampled at T = 1, batch 1, 64 and 256 (also
//! greedy in bf16, sampled in f32 and in f32 with TF32 products, what `dtype`'s choices rest on);
//! σ (40 cuts of a 1,000-token trace) scored in bf16 and with TF32 products against f32, and σ
//! scoring's seconds at Table 2's shape in each; where a decode step's time goes, piece by piece
//! (`model::step_profile`). Saves the model as a Hugging Face
//! checkpoint so transformers (bench/gpu_transformers.py) decodes the same weights.
//!
//! usage: bench_gpu OUT_DIR  (writes OUT_DIR/ours.json and OUT_DIR/model/)
//!        bench_gpu train DTYPE CHECKPOINTING BATCH LEN
//!   One update's forward + backward + AdamW step of the same model on BATCH random sequences of
//!   LEN tokens (DTYPE f32 or bf16 = mixed precision with f32 master weights; CHECKPOINTING
//!   true/false), twice; prints the seconds of each step as JSON. bench/gpu.sh runs it in its own
//!   process per setting and reads the peak GPU memory beside it.

use std::path::Path;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rredcot::credit::sigma;
use rredcot_ml::model::matmul_precision::set_cuda_matmul_tf32;
use rredcot_ml::model::step_profile::{self, sync, time, StepMask};
use rredcot_ml::model::{self, DecoderLm, ModelConfig, SamplingParams};
use rredcot_ml::train::adamw::{clip_grads, grad_norm, AdamW, AdamWConfig};
use rredcot_ml::train::step::{TrainDtype, TrainModel};
use tch::{Device, Kind, Tensor};

/// The 1.5B shape: hidden 1536, 28 layers, 12 q / 2 kv heads, vocab 151936.
fn table2_config() -> anyhow::Result<ModelConfig> {
    let json = serde_json::json!({
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
        "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": false, "bos_token_id": 151643, "eos_token_id": 151643,
    });
    Ok(ModelConfig::from_json_str(&json.to_string(), Path::new("<bench_gpu>"))?)
}

/// BENCH_GPU_SMOKE's model: the 1.5B shape's layout (12 q / 2 kv heads, untied head) at a
/// size a CPU runs the whole benchmark with in a minute.
fn smoke_config() -> anyhow::Result<ModelConfig> {
    let json = serde_json::json!({
        "model_type": "qwen2", "vocab_size": 1024, "hidden_size": 96, "intermediate_size": 192,
        "num_hidden_layers": 2, "num_attention_heads": 12, "num_key_value_heads": 2,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 1,
    });
    Ok(ModelConfig::from_json_str(&json.to_string(), Path::new("<bench_gpu smoke>"))?)
}

/// `bench_gpu train DTYPE CHECKPOINTING BATCH LEN`: seconds of two optimizer steps.
fn train(args: &[String]) -> anyhow::Result<()> {
    let [dtype, ckpt, batch, len] = args else {
        anyhow::bail!("usage: bench_gpu train DTYPE CHECKPOINTING BATCH LEN")
    };
    let dtype: TrainDtype = serde_json::from_value(serde_json::Value::String(dtype.clone()))?;
    let (batch, len): (i64, i64) = (batch.parse()?, len.parse()?);
    let dev = Device::Cuda(0);
    let cfg = table2_config()?;
    tch::manual_seed(0);
    let model = TrainModel::new(DecoderLm::new(&cfg, dev), dtype, ckpt.parse()?);
    let ids = Tensor::randint(cfg.vocab_size, [batch, len], (Kind::Int64, dev));
    let mut opt = AdamW::new(AdamWConfig { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.0 });
    let mut seconds = Vec::new();
    for _ in 0..2 {
        tch::Cuda::synchronize(0);
        let t = Instant::now();
        model.zero_grad();
        let loss = model.backward(&ids, 1.0, |logp| {
            let l = -logp.mean(Kind::Float);
            let v = l.double_value(&[]);
            Ok((l, v))
        })?;
        let norm = grad_norm(model.params()).map_err(|name| anyhow::anyhow!("gradient of {name} is not finite"))?;
        clip_grads(model.params(), norm, 1.0);
        opt.step(model.params(), 1e-6)?;
        model.weights_changed();
        tch::Cuda::synchronize(0);
        seconds.push(t.elapsed().as_secs_f64());
        eprintln!("train {dtype:?} checkpointing={ckpt} {batch}x{len}: loss {loss:.4}, {:.2} s", t.elapsed().as_secs_f64());
    }
    println!("{}", serde_json::json!({ "step_seconds": seconds }));
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("train") {
        return train(&args[2..]);
    }
    let [_, out] = args.as_slice() else {
        anyhow::bail!("usage: bench_gpu OUT_DIR | bench_gpu train DTYPE CHECKPOINTING BATCH LEN")
    };
    let out = Path::new(out);
    // DECODE_FIGURES (space-separated, default every one of FIGURES): the decode figures this run
    // measures, so a GPU session short of device time measures what is new.
    let figures = decode_figures()?;
    // BENCH_GPU_SMOKE=1: the whole run on the CPU with a tiny model of the same layout, to check
    // before device time is spent that every part runs to its JSON (its figures mean nothing).
    let smoke = std::env::var("BENCH_GPU_SMOKE").is_ok_and(|v| v == "1");
    anyhow::ensure!(
        smoke || tch::Cuda::is_available(),
        "bench_gpu: libtorch sees no CUDA device"
    );
    let dev = if smoke { Device::Cpu } else { Device::Cuda(0) };
    let cfg = if smoke { smoke_config()? } else { table2_config()? };
    tch::manual_seed(0);
    let mut m = DecoderLm::new(&cfg, dev);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let prompt: Vec<i64> = (0..64)
        .map(|_| rng.random_range(0..cfg.vocab_size))
        .collect();

    // σ's inputs (R and v log-probabilities) in bf16 against f32 on a 1,000-token trace.
    let trace: Vec<i64> = (0..1000)
        .map(|_| rng.random_range(0..cfg.vocab_size))
        .collect();
    let cuts: Vec<usize> = (0..=40).map(|i| 64 + i * 23).collect();
    let targets = vec![trace[990..998].to_vec(), trace[100..162].to_vec()];
    let f32_scores = tch::no_grad(|| model::score_cuts(&m, &trace, &cuts, &targets))?;
    // The same in float32 with TF32 products (`dtype = "tf32"`).
    set_cuda_matmul_tf32(true);
    let tf32_scores = tch::no_grad(|| model::score_cuts(&m, &trace, &cuts, &targets))?;
    set_cuda_matmul_tf32(false);
    // σ scoring's time per precision at Table 2's shape: 4 traces of 1,088 tokens, 120 cuts
    // each, targets of 8 and 62 tokens, as score_sigma runs them (one pack per trace); best of 3.
    let (n_traces, reps) = if smoke { (1, 1) } else { (4, 3) };
    let traces: Vec<Vec<i64>> = (0..n_traces).map(|_| (0..1088).map(|_| rng.random_range(0..cfg.vocab_size)).collect()).collect();
    let table2_cuts: Vec<usize> = (0..120).map(|i| 64 + i * 8).collect();
    let score_seconds = |m: &DecoderLm| -> anyhow::Result<f64> {
        let reqs: Vec<model::CutRequest> =
            traces.iter().map(|t| model::CutRequest::every_target(t, &table2_cuts, &targets)).collect();
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            sync(dev);
            let t = Instant::now();
            tch::no_grad(|| model::score_cuts_batch(m, &reqs, model::CutScorer::KvShared, 0, true, |_| {}))?;
            sync(dev);
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let f32_score_s = score_seconds(&m)?;
    set_cuda_matmul_tf32(true);
    let tf32_score_s = score_seconds(&m)?;
    set_cuda_matmul_tf32(false);
    m.set_kind(Kind::BFloat16);
    let bf16_scores = tch::no_grad(|| model::score_cuts(&m, &trace, &cuts, &targets))?;
    let bf16_score_s = score_seconds(&m)?;
    // σ (l1-normalized ΔR + Δv, as score_sigma's defaults) from each: out[cut][target].
    let sigma = |s: &[Vec<f64>]| {
        let (r, v): (Vec<f64>, Vec<f64>) = s.iter().map(|c| (c[0], c[1])).unzip();
        sigma::normalize(
            &sigma::unnormalized(&r, &v, sigma::Terms::Both),
            sigma::Normalize::L1,
        )
        .0
    };
    let max_abs = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f64, f64::max);
    let flat = |s: &[Vec<f64>]| s.iter().flatten().copied().collect::<Vec<f64>>();
    let s32 = sigma(&f32_scores);
    model::save(&m, None, &out.join("model"))?;
    // Before any decode: transformers' side needs the prompt even if this run is cut short.
    std::fs::write(out.join("prompt.json"), serde_json::to_string(&prompt)?)?;

    let mut res = serde_json::Map::new();
    for (name, scores) in [("bf16", &bf16_scores), ("tf32", &tf32_scores)] {
        res.insert(format!("sigma_{name}_vs_f32_max_abs"), max_abs(&s32, &sigma(scores)).into());
        res.insert(format!("score_logprob_{name}_vs_f32_max_abs"), max_abs(&flat(&f32_scores), &flat(scores)).into());
    }
    for (name, secs) in [("f32", f32_score_s), ("tf32", tf32_score_s), ("bf16", bf16_score_s)] {
        eprintln!("σ scoring, {n_traces} traces x 120 cuts, {name}: {secs:.2} s");
        res.insert(format!("score_seconds_{n_traces}x120_cuts_{name}"), secs.into());
    }
    let wanted = |key: &str| figures.iter().any(|f| f == key);
    // ours.json after every figure: a run stopped by bench/gpu.sh's DECODE_TIMEOUT keeps the
    // figures it finished.
    let save = |res: &serde_json::Map<String, serde_json::Value>| -> anyhow::Result<()> {
        Ok(std::fs::write(out.join("ours.json"), serde_json::to_string_pretty(res)?)?)
    };
    save(&res)?;
    // Tokens/s of decodes of `b` copies of the prompt after a warm-up: REPEATS timed runs
    // (default 3), the median and every run (one timed run per figure left a 20-30% spread at
    // b256 unexplained).
    let repeats: usize = std::env::var("REPEATS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1);
    // `continuous`: through continuous batching (one slot per row, as the sampling stages'
    // default), else one static batch.
    let decode = |m: &DecoderLm, b: usize, temperature: f64, continuous: bool| -> anyhow::Result<(f64, Vec<f64>)> {
        let prompts = vec![prompt.clone(); b];
        let seeds: Vec<u64> = (0..b as u64).collect();
        let p = SamplingParams {
            temperature,
            max_new_tokens: 128,
            ..Default::default()
        };
        let run = || {
            tch::no_grad(|| {
                if continuous {
                    model::generate_continuous(m, None, &prompts, &seeds, &p, 0)
                } else {
                    model::generate(m, None, &prompts, &seeds, &p)
                }
            })
        };
        // Warm-up: the same decode in full. A first decode at a batch size ran up to 6x slower
        // than the next (kernels loaded and caches grown as the context lengthens).
        run()?;
        let mut runs = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            sync(dev);
            let t = Instant::now();
            let g = run()?;
            sync(dev);
            let n: usize = g.iter().map(|x| x.tokens.len()).sum();
            runs.push(n as f64 / t.elapsed().as_secs_f64());
        }
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        let median = if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 };
        Ok((median, runs))
    };
    let record = |res: &mut serde_json::Map<String, serde_json::Value>, key: String, (median, runs): (f64, Vec<f64>)| {
        res.insert(format!("{key}_runs"), runs.into());
        res.insert(key, median.into());
        median
    };
    // The sampler alone on [B, V] float32 probabilities: the one-level inverse cdf (PyTorch's
    // scan over a whole row) against the two-level one CUDA decoding uses; and top_p's filter.
    if wanted("sampler") {
        for b in [1i64, 64, 256] {
            let probs = (Tensor::randn([b, cfg.vocab_size], (Kind::Float, dev)) * 3.0).softmax(-1, Kind::Float);
            let u = Tensor::rand([b], (Kind::Float, dev));
            let one = time(dev, 20, || {
                let _ = model::generate::inverse_cdf(&probs, &u);
            });
            let two = time(dev, 20, || {
                let _ = model::generate::inverse_cdf_chunked(&probs, &u, 1024);
            });
            // top_p's filter (the paper's evaluations sample with top_p 0.95), which sorts every
            // row on a GPU: its cost beside a decode step's (step_breakdown).
            let logits = Tensor::randn([b, cfg.vocab_size], (Kind::Float, dev)) * 3.0;
            let top_p = time(dev, 20, || {
                let _ = model::nucleus::top_p_drop(&logits, 0.95);
            });
            eprintln!("sampler b{b}: one-level {one:.2} ms, chunked {two:.2} ms, top_p filter {top_p:.2} ms");
            res.insert(format!("sampler_ms_one_level_b{b}"), one.into());
            res.insert(format!("sampler_ms_chunked_b{b}"), two.into());
            res.insert(format!("top_p_filter_ms_b{b}"), top_p.into());
        }
    }
    // Where a bf16 decode step's time goes, per piece over the layers, at 128 cached tokens (the
    // middle of the decode below), on the eager static batch's attention and on the biased one
    // continuous batching and the CUDA graphs run.
    if wanted("step_breakdown") {
        for b in [1i64, 64, 256] {
            for (name, mask) in [("full", StepMask::Full), ("bias", StepMask::Bias)] {
                let pieces = step_profile::decode_step(&m, b, 128, mask, if smoke { 2 } else { 20 });
                eprintln!("decode step b{b} ({name} attention), ms: {pieces:?}");
                let map: serde_json::Map<String, serde_json::Value> = pieces.into_iter().map(|(k, ms)| (k.to_string(), ms.into())).collect();
                res.insert(format!("step_breakdown_ms_b{b}_{name}"), map.into());
            }
        }
        save(&res)?;
    }
    // `key`_tok_s_b{b}: the median decode rate at each batch in `batches`, sampled at `t`, in
    // one static batch or through continuous batching (`continuous`).
    let measure = |res: &mut serde_json::Map<String, serde_json::Value>,
                   m: &DecoderLm,
                   key: &str,
                   what: &str,
                   batches: &[usize],
                   t: f64,
                   continuous: bool|
     -> anyhow::Result<()> {
        if !wanted(key) {
            return Ok(());
        }
        for &b in batches {
            let rate = record(res, format!("{key}_tok_s_b{b}"), decode(m, b, t, continuous)?);
            eprintln!("ours {what} b{b}: {rate:.0} tok/s");
            save(res)?;
        }
        Ok(())
    };
    // bf16 sampled at T = 1 is the headline (transformers' side of the table); greedy bf16 and
    // f32 sampled are what `device = auto`'s dtype choice rests on.
    measure(&mut res, &m, "decode", "bf16 sampled", &[1, 64, 256], 1.0, false)?;
    // The sampling stages' default path: the same rows through continuous batching.
    measure(&mut res, &m, "decode_continuous", "bf16 sampled, continuous batching,", &[256], 1.0, true)?;
    // The same decode with q|k|v and gate|up as separate products (the path before they were
    // fused, and the CPU's), in the same run.
    std::env::set_var("RREDCOT_DECODE_FUSION", "0");
    measure(&mut res, &m, "decode_unfused", "bf16 sampled, projections not fused,", &[1, 64, 256], 1.0, false)?;
    std::env::remove_var("RREDCOT_DECODE_FUSION");
    // The same decode with its steps replayed as a CUDA graph (where this build has them:
    // bench/gpu_bundle.sh; opt-in by RREDCOT_DECODE_GRAPHS=1), in the same run.
    res.insert("decode_cuda_graphs".into(), model::cuda_graph::AVAILABLE.into());
    if model::cuda_graph::AVAILABLE {
        std::env::set_var("RREDCOT_DECODE_GRAPHS", "1");
        // Not yet run on a GPU: a failed capture is recorded as `{key}_error` and the figures
        // after it are still measured (where the CUDA context survived it).
        for (key, what, batches, continuous) in [
            ("decode_graph", "bf16 sampled, steps replayed as a CUDA graph,", &[1, 64, 256][..], false),
            ("decode_continuous_graph", "bf16 sampled, continuous batching replayed as a CUDA graph,", &[256], true),
        ] {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                measure(&mut res, &m, key, what, batches, 1.0, continuous)
            }));
            let error = match outcome {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("{e:#}")),
                Err(panic) => Some(panic_message(panic.as_ref())),
            };
            if let Some(e) = error {
                eprintln!("ours {what}: FAILED: {e}");
                res.insert(format!("{key}_error"), e.into());
                save(&res)?;
            }
        }
        std::env::remove_var("RREDCOT_DECODE_GRAPHS");
    }
    measure(&mut res, &m, "decode_greedy", "bf16 greedy", &[1, 256], 0.0, false)?;
    m.set_kind(Kind::Float);
    measure(&mut res, &m, "decode_f32", "f32 sampled", &[1, 64, 256], 1.0, false)?;
    set_cuda_matmul_tf32(true);
    measure(&mut res, &m, "decode_tf32", "f32 with TF32 products, sampled", &[1, 64, 256], 1.0, false)?;
    set_cuda_matmul_tf32(false);
    save(&res)
}

/// The decode figures `bench_gpu OUT_DIR` can measure (DECODE_FIGURES names some of them).
const FIGURES: [&str; 10] = [
    "sampler",
    "step_breakdown",
    "decode",
    "decode_continuous",
    "decode_unfused",
    "decode_graph",
    "decode_continuous_graph",
    "decode_greedy",
    "decode_f32",
    "decode_tf32",
];

/// DECODE_FIGURES's names (every figure when unset), each checked against [`FIGURES`].
fn decode_figures() -> anyhow::Result<Vec<String>> {
    let Ok(list) = std::env::var("DECODE_FIGURES") else {
        return Ok(FIGURES.iter().map(|f| f.to_string()).collect());
    };
    let names: Vec<String> = list.split_whitespace().map(String::from).collect();
    if let Some(bad) = names.iter().find(|n| !FIGURES.contains(&n.as_str())) {
        anyhow::bail!("DECODE_FIGURES: no figure named {bad:?} (known: {})", FIGURES.join(" "));
    }
    Ok(names)
}

/// What a caught panic said.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic without a message".into())
}
