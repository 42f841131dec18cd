"""`rredcot serve` through OpenAI's own Python client (the `openai` package), as users and tools
call it: usage: openai_client.py BASE_URL MODEL_NAME. Asserts what the client sees and prints one
JSON line of it; exits non-zero (with the failed check) when the server's answers do not fit.

No retries: a request the server never answers fails here instead of being asked again. (The
old tiny_http server passed this script too, 4 of 4 runs: the lost-request race is tested by
`serve::front`'s unit test and `judge_serve`'s retry count, not here.)
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import openai

url, name = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60.0)
seen = {"openai": openai.__version__}

models = [m.id for m in client.models.list().data]
assert models == [name], models

ask = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2 + 3?"}]
chat = client.chat.completions.create(model=name, messages=ask, n=2, seed=5, temperature=1.0, max_tokens=8)
assert chat.object == "chat.completion" and chat.model == name, chat
assert [c.index for c in chat.choices] == [0, 1], chat.choices
assert all(c.message.role == "assistant" and isinstance(c.message.content, str) for c in chat.choices), chat.choices
assert all(c.finish_reason in ("stop", "length") for c in chat.choices), chat.choices
u = chat.usage
assert 0 < u.completion_tokens <= 16 and u.total_tokens == u.prompt_tokens + u.completion_tokens, u
again = client.chat.completions.create(model=name, messages=ask, n=2, seed=5, temperature=1.0, max_tokens=8)
assert [c.message.content for c in again.choices] == [c.message.content for c in chat.choices], "a seeded request samples the same"
seen["chat"] = [c.message.content for c in chat.choices]

# A completion from token ids, with the top-2 logprobs of each sampled token.
comp = client.completions.create(model=name, prompt=[1, 2, 3, 4], max_tokens=4, temperature=0.0, logprobs=2)
lp = comp.choices[0].logprobs
assert comp.object == "text_completion" and len(lp.tokens) == len(lp.token_logprobs) == comp.usage.completion_tokens, comp
assert all(len(top) <= 2 and all(v <= 0.0 for v in top.values()) for top in lp.top_logprobs), lp.top_logprobs
# Greedy: the sampled token is the most likely one.
assert all(abs(max(top.values()) - chosen) < 1e-4 for top, chosen in zip(lp.top_logprobs, lp.token_logprobs)), lp
seen["completion_tokens"] = lp.tokens

# What the server refuses comes back as the client's 400 error, with the server's reason.
for bad, why in [({"stream": True}, "stream"), ({"n": 99}, "n = 99"), ({"messages": []}, "empty")]:
    args = {"model": name, "messages": ask, "max_tokens": 4, **bad}
    try:
        client.chat.completions.create(**args)
        raise AssertionError(f"{bad} was accepted")
    except openai.BadRequestError as e:
        assert why in str(e), (bad, str(e))

# Many requests at once over the client's connection pool: every one is answered.
def one(i):
    r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": f"Say {i}."}], max_tokens=6, temperature=0.7, seed=i)
    return r.choices[0].message.content

with ThreadPoolExecutor(16) as pool:
    answers = list(pool.map(one, range(48)))
assert len(answers) == 48 and all(isinstance(a, str) for a in answers)
seen["concurrent_answers"] = len(answers)

# Requests with different sampling params at once: each is decoded under its own (the server
# runs one params set per session), so none gets more tokens than it asked for.
def mixed(i):
    budget = 2 + i % 3
    r = client.completions.create(model=name, prompt=[5 + i, 6, 7], max_tokens=budget, temperature=[0.0, 1.0][i % 2], seed=i)
    return budget, r.usage.completion_tokens, r.choices[0].finish_reason

with ThreadPoolExecutor(12) as pool:
    got = list(pool.map(mixed, range(36)))
assert all(0 < used <= budget and (why == "stop" or (why == "length" and used == budget)) for budget, used, why in got), got
seen["mixed_params_answers"] = len(got)
print(json.dumps(seen))
