"""A proxy in front of an inference engine, for ml/tests/engines.rs and bench/engine_stale.sh; its
modes are documented at `PROXY` in ml/tests/engines.rs."""
import json, os, random, socket, subprocess, sys, time, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, mode = int(sys.argv[1]), sys.argv[2]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); inner = s.getsockname()[1]
def checkpoint_of(view):
    assert json.load(open(os.path.join(view, "config.json")))["tie_word_embeddings"] is False, view
    assert os.path.exists(os.path.join(view, "lm_head.safetensors")), view
    assert os.path.islink(os.path.join(view, "model.safetensors")), view
    return os.path.dirname(os.path.realpath(os.path.join(view, "model.safetensors")))
argv = [a.replace("INNER", str(inner)) for a in sys.argv[3:]]
if mode == "vllm":
    i = argv.index("--model") + 1
    argv[i] = checkpoint_of(argv[i])
engine = subprocess.Popen(argv)
# vllm mode: the tags asleep after `POST /sleep?level=2` (vLLM's executor keeps the same set).
asleep = set()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, status, body):
        self.send_response(status); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def forward(self, data):
        req = urllib.request.Request(f"http://127.0.0.1:{inner}{self.path}", data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                self.reply(r.status, r.read())
        except urllib.error.HTTPError as e:
            self.reply(e.code, e.read())
        except OSError:
            self.reply(503, b'{"error": "not up"}')
    def do_GET(self):
        if mode == "vllm" and self.path == "/is_sleeping":
            return self.reply(200, json.dumps({"is_sleeping": bool(asleep)}).encode())
        if mode == "sglang" and self.path == "/version":
            return self.reply(404, b'{"detail": "Not Found"}')
        if mode == "sglang" and self.path == "/server_info":
            return self.reply(200, b'{"version": "0.5.23-proxy"}')
        if mode == "sglang" and self.path == "/v1/models":
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{inner}/v1/models", timeout=600) as r:
                    models = json.loads(r.read())
            except OSError:
                return self.reply(503, b'{"error": "not up"}')
            for m in models["data"]:
                m["owned_by"] = "sglang"
            return self.reply(200, json.dumps(models).encode())
        self.forward(None)
    def do_POST(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        if mode == "unseeded" and self.path == "/v1/completions":
            data = json.dumps(dict(json.loads(data), seed=random.randrange(2**62))).encode()
        if mode == "sglang" and self.path == "/v1/completions" and json.loads(data).get("n", 1) > 1:
            return self.reply(400, b'{"error": "n > 1: its choices would share one seed"}')
        if mode == "stale" and self.path == "/update_weights_from_disk":
            return self.reply(200, json.dumps({"success": True}).encode())
        if mode == "vllm" and self.path == "/reset_prefix_cache":
            return self.reply(200, b"{}")
        # vLLM's sleep as its dev-mode routes answer (level 2: the weights and the KV cache given
        # up; the weights woken, then loaded, then the KV cache), passed on as SGLang's release
        # and resume; sampling while anything sleeps is refused (vLLM's scheduler is paused then).
        if mode == "vllm" and self.path == "/sleep?level=2":
            asleep.update({"weights", "kv_cache"})
            self.path = "/release_memory_occupation"
            return self.forward(b"{}")
        if mode == "vllm" and self.path.startswith("/wake_up?tags="):
            tag = self.path.split("=", 1)[1]
            assert tag in asleep, (tag, asleep)
            asleep.discard(tag)
            if tag == "weights":
                self.path = "/resume_memory_occupation"
                return self.forward(b"{}")
            return self.reply(200, json.dumps({"status": "sleeping" if asleep else "awake", "tags": [tag]}).encode())
        if mode == "vllm" and asleep and (self.path == "/v1/completions" or (self.path == "/collective_rpc" and "weights" in asleep)):
            return self.reply(409, json.dumps({"error": f"{self.path} while {sorted(asleep)} sleep"}).encode())
        if mode == "vllm" and self.path == "/collective_rpc":
            kwargs = json.loads(data)["kwargs"]
            assert kwargs["is_checkpoint_format"] is True
            self.path = "/update_weights_from_disk"
            data = json.dumps({"model_path": checkpoint_of(kwargs["weights_path"])}).encode()
        self.forward(data)
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
