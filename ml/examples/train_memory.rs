//! Whether a training step's memory grows from one micro-batch to the next: 40 forward+backward
//! passes of 16 random sequences through a Qwen2 model of Qwen's 151,936-token vocabulary with 2
//! layers of width 64 (the CPU Table 2 benchmarks' model), printing the process's resident memory
//! after each. Run with the caching allocator off and glibc mapping every block of 1 MiB or more
//! anew, so a freed tensor's pages leave the process:
//!
//!   RREDCOT_CPU_CACHE_MB=0 MALLOC_MMAP_THRESHOLD_=1048576 \
//!     cargo run --release -p rredcot-ml --example train_memory -- bf16|f32 ckpt|nockpt same|cycle|vary
//!
//! `same`: every micro-batch 200 tokens long; `cycle`: five lengths in turn; `vary`: a new length
//! each time (as an update's micro-batches have). README ("CPU memory") has the figures.
use rredcot_ml::model::{DecoderLm, ModelConfig};
use rredcot_ml::train::step::{TrainDtype, TrainModel};
use tch::{Device, Kind, Tensor};

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS")).expect("VmRSS");
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()).expect("VmRSS in kB") / 1024.0
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dtype, ckpt, lengths] = args.as_slice() else {
        eprintln!("usage: train_memory bf16|f32 ckpt|nockpt same|cycle|vary");
        std::process::exit(2);
    };
    let dtype = if dtype == "bf16" { TrainDtype::Bf16 } else { TrainDtype::F32 };
    let json = r#"{"model_type":"qwen2","architectures":["Qwen2ForCausalLM"],"vocab_size":151936,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":4096,"rms_norm_eps":1e-6,"rope_theta":10000.0,"tie_word_embeddings":true,"hidden_act":"silu","torch_dtype":"float32"}"#;
    let cfg = ModelConfig::from_json_str(json, std::path::Path::new("<train_memory config>")).expect("config");
    tch::manual_seed(0);
    let train = TrainModel::new(DecoderLm::new(&cfg, Device::Cpu), dtype, ckpt == "ckpt");
    for it in 0..40 {
        let len = match lengths.as_str() {
            "vary" => 150 + (it * 7) % 60,
            "cycle" => 150 + (it % 5) * 10,
            _ => 200,
        };
        let ids = Tensor::randint(151936, [16, len], (Kind::Int64, Device::Cpu));
        train.zero_grad();
        train.backward(&ids, 1.0, |logp| Ok((logp.sum(Kind::Float), ()))).expect("backward");
        println!("micro-batch {it}: {len} tokens, resident {:.0} MB", rss_mb());
    }
}
