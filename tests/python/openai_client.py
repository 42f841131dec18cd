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

# A greedy chat with each token's logprob and its top 2, read through the client's own types.
lc = client.chat.completions.create(model=name, messages=ask, max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=2)
content = lc.choices[0].logprobs.content
assert len(content) == lc.usage.completion_tokens, (len(content), lc.usage)
assert all(len(t.top_logprobs) == 2 and t.logprob <= 0.0 for t in content), content
assert all(abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4 and t.top_logprobs[0].token == t.token for t in content), content
assert "".join(t.token for t in content).startswith(lc.choices[0].message.content), (content, lc.choices[0].message.content)
seen["chat_logprob_tokens"] = [t.token for t in content]

# Streamed through the client's own reader of server-sent events: the chunks of the same seeded
# request make up the same choices, and the usage comes in the last chunk.
def streamed(create, **args):
    text, finish, usage, pieces = {}, {}, None, 0
    for chunk in create(stream=True, stream_options={"include_usage": True}, **args):
        usage = chunk.usage or usage
        for c in chunk.choices:
            piece = c.delta.content if hasattr(c, "delta") else c.text
            text[c.index] = text.get(c.index, "") + (piece or "")
            pieces += bool(piece)
            if c.finish_reason:
                assert c.index not in finish, f"choice {c.index} ended twice"
                finish[c.index] = c.finish_reason
    return [text[i] for i in sorted(text)], [finish[i] for i in sorted(finish)], usage, pieces

text, finish, usage, pieces = streamed(client.chat.completions.create, model=name, messages=ask, n=2, seed=5, temperature=1.0, max_tokens=8)
assert text == seen["chat"] and finish == [c.finish_reason for c in chat.choices], (text, finish, chat.choices)
assert usage.completion_tokens == chat.usage.completion_tokens and usage.prompt_tokens == chat.usage.prompt_tokens, (usage, chat.usage)
seen["chat_stream_pieces"] = pieces

# A streamed completion with a stop string that its text meets: cut where the whole reply is cut.
# The first seed whose text is long enough to be cut in its middle (seeded: the same every run).
for seed in range(11, 60):
    full = client.completions.create(model=name, prompt="Start with", max_tokens=32, temperature=1.0, seed=seed).choices[0].text
    if len(full.strip()) >= 8:
        break
assert len(full.strip()) >= 8, f"no seed gave 8 characters: {full!r}"
stop = full[len(full) // 2 : len(full) // 2 + 2]
args = dict(model=name, prompt="Start with", max_tokens=32, temperature=1.0, seed=seed, stop=stop)
cut = client.completions.create(**args)
text, finish, usage, _ = streamed(client.completions.create, **args)
assert text == [cut.choices[0].text] and finish == [cut.choices[0].finish_reason], (text, finish, cut.choices, stop)
assert finish == ["stop"] and len(text[0]) < len(full) and full.startswith(text[0]), (stop, text, full)
seen["completion_stream"] = {"seed": seed, "stop": stop, "text": text[0], "whole": full}

# A completion from token ids, with the top-2 logprobs of each sampled token.
comp = client.completions.create(model=name, prompt=[1, 2, 3, 4], max_tokens=4, temperature=0.0, logprobs=2)
lp = comp.choices[0].logprobs
assert comp.object == "text_completion" and len(lp.tokens) == len(lp.token_logprobs) == comp.usage.completion_tokens, comp
assert all(len(top) <= 2 and all(v <= 0.0 for v in top.values()) for top in lp.top_logprobs), lp.top_logprobs
# Greedy: the sampled token is the most likely one.
assert all(abs(max(top.values()) - chosen) < 1e-4 for top, chosen in zip(lp.top_logprobs, lp.token_logprobs)), lp
seen["completion_tokens"] = lp.tokens

# Streamed with logprobs, read through the client's types: they come whole with each choice's
# last chunk, the same as unstreamed.
def streamed_logprobs(create, **args):
    got = {}
    for chunk in create(stream=True, **args):
        for c in chunk.choices:
            if c.logprobs is not None:
                assert c.finish_reason, f"logprobs before choice {c.index}'s last chunk"
                got[c.index] = c.logprobs
    return got

chat_lp = streamed_logprobs(client.chat.completions.create, model=name, messages=ask, max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=2)
assert [(t.token, round(t.logprob, 5)) for t in chat_lp[0].content] == [(t.token, round(t.logprob, 5)) for t in content], (chat_lp, content)
assert [[x.token for x in t.top_logprobs] for t in chat_lp[0].content] == [[x.token for x in t.top_logprobs] for t in content]
comp_lp = streamed_logprobs(client.completions.create, model=name, prompt=[1, 2, 3, 4], max_tokens=4, temperature=0.0, logprobs=2)
assert comp_lp[0].tokens == lp.tokens and comp_lp[0].text_offset == lp.text_offset, (comp_lp, lp)
assert all(abs(a - b) < 1e-5 for a, b in zip(comp_lp[0].token_logprobs, lp.token_logprobs)), (comp_lp, lp)
seen["stream_logprobs"] = len(chat_lp[0].content) + len(comp_lp[0].tokens)

# What the server refuses comes back as the client's 400 error, with the server's reason.
for bad, why in [({"n": 99}, "n = 99"), ({"messages": []}, "empty"), ({"presence_penalty": 0.5}, "`presence_penalty` is not supported")]:
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

# Streamed and whole requests at once: every stream ends with a reason and its usage.
def either(i):
    args = dict(model=name, messages=[{"role": "user", "content": f"Say {i}."}], max_tokens=6, temperature=0.7, seed=i)
    if i % 2:
        return client.chat.completions.create(**args).choices[0].finish_reason
    _, finish, usage, _ = streamed(client.chat.completions.create, **args)
    assert len(finish) == 1 and 0 < usage.completion_tokens <= 6, (finish, usage)
    return finish[0]

with ThreadPoolExecutor(16) as pool:
    reasons = list(pool.map(either, range(32)))
assert all(r in ("stop", "length") for r in reasons), reasons
seen["concurrent_streams"] = 16

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
