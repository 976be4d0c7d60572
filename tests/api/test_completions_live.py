"""The llama-server / vLLM endpoints on live servers: legacy ``/v1/completions`` through the
openai SDK (whole, streamed, echo, stop, the raw path against ``manage.py generate --raw``),
fill-in-the-middle on Qwen2.5-Coder (``suffix`` and llama.cpp's ``/infill``), ``/tokenize``
and ``/detokenize`` round trips, ``max_model_len`` on ``/v1/models`` and the ``llamacpp:``
metrics moving after requests. SmolLM2 runs on the shared session server (no FIM tokens: the
FIM fields are refused there)."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest

from inference.model_files import resolve_model

from .conftest import API_KEY, MAIN_SERVER_FLAGS, ROOT, openai_client, start_lmserve
from .test_metrics_live import scrape, value

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

PROMPT = "The capital of France is"
QWEN = "qwen2.5-coder-0.5b"
FIB_PREFIX = "def fibonacci(n):\n    "
FIB_SUFFIX = "\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
CTX = int(MAIN_SERVER_FLAGS[MAIN_SERVER_FLAGS.index("--ctx") + 1])


def post(server, path: str, body: dict) -> httpx.Response:
    headers = {"authorization": f"Bearer {API_KEY}"}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=300)


def sse_data(response: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]


# -- /v1/completions on SmolLM2 -------------------------------------------------------------------
def test_greedy_completion_is_what_generate_raw_writes(client, idle_server):
    reply = client.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert choice.index == 0 and choice.logprobs is None
    assert choice.finish_reason in ("length", "stop")
    run = subprocess.run(
        [sys.executable, "manage.py", "generate", "--raw", "--prompt", PROMPT, "--max-tokens", "24"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    assert choice.text == run.stdout.removesuffix("\n")
    assert choice.text.strip(), "an empty completion proves nothing"
    tokens = post(idle_server, "/tokenize", {"content": PROMPT, "add_special": True}).json()["tokens"]
    assert reply.usage.prompt_tokens == len(tokens)
    assert reply.usage.completion_tokens <= 24


def test_streamed_completion_equals_the_whole_one_and_reports_usage(client):
    whole = client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(
        client.completions.create(
            model="m",
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.object == "text_completion" for c in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_echo_prepends_the_prompt_streamed_or_not(client):
    plain = client.completions.create(model="m", prompt=PROMPT, max_tokens=6, temperature=0)
    echoed = client.completions.create(model="m", prompt=PROMPT, max_tokens=6, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    stream = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=6, temperature=0, echo=True, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == echoed.choices[0].text


def test_logprobs_are_the_chat_dialects_numbers_in_the_legacy_shape(client):
    """``logprobs: N``: the greedy token is the most likely of N alternatives, the tokens spell
    the reply, offsets count from the echoed prompt, and a stream reports the same numbers."""
    whole = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3, echo=True
    )
    choice = whole.choices[0]
    reported = choice.logprobs
    assert "".join(reported.tokens) == choice.text[len(PROMPT) :]
    assert reported.text_offset[0] == len(PROMPT) and reported.text_offset == sorted(reported.text_offset)
    for token, logprob, top in zip(
        reported.tokens, reported.token_logprobs, reported.top_logprobs, strict=True
    ):
        assert len(top) == 3 and logprob <= 0 and max(top.values()) == pytest.approx(logprob)
        assert top[token] == pytest.approx(logprob)
    stream = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3, stream=True
    )
    streamed = [
        lp
        for c in stream
        if c.choices and c.choices[0].logprobs
        for lp in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed == reported.token_logprobs
    plain = client.completions.create(model="m", prompt=PROMPT, max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None


def test_token_id_prompt_is_the_same_prompt(client, idle_server):
    ids = post(idle_server, "/tokenize", {"content": PROMPT, "add_special": True}).json()["tokens"]
    by_text = client.completions.create(model="m", prompt=PROMPT, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model="m", prompt=ids, max_tokens=8, temperature=0, echo=True)
    assert by_ids.choices[0].text == PROMPT + by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens


def test_stop_ends_the_completion_before_the_stop_string(client):
    free = client.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    cut = free.strip().split()[1]  # a word the free completion writes after its first
    stopped = client.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0, stop=[cut])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == free[: free.index(cut)]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"suffix": "\nreturn x"}, "suffix"),  # SmolLM2 has no FIM tokens
        ({"logprobs": 6}, "logprobs"),
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": [1, 99999999]}, "prompt"),
        ({"prompt": "x " * 1100}, "prompt"),  # longer than --ctx
    ],
)
def test_refusals_name_the_field(client, extra, param):
    body = {"prompt": PROMPT, "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="m", **body)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param, caught.value.body


def test_unprefixed_path_and_null_logprobs(http):
    reply = http.post(
        "/completions", json={"prompt": PROMPT, "max_tokens": 3, "logprobs": None, "echo": False}
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["logprobs"] is None


# -- /tokenize, /detokenize, /v1/models -----------------------------------------------------------
def test_tokenize_detokenize_round_trip(http):
    text = "Hello, wörld! 1234 <|im_start|>"
    plain = http.post("/tokenize", json={"content": text}).json()["tokens"]
    assert plain and all(isinstance(t, int) for t in plain)
    assert http.post("/detokenize", json={"tokens": plain}).json() == {"content": text}
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == plain
    # A piece is text when its bytes are UTF-8 on their own, else the byte values.
    joined = b"".join(
        p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces
    )
    assert joined == text.encode()
    special = http.post("/tokenize", json={"content": "<|im_start|>"}).json()["tokens"]
    literal = http.post("/tokenize", json={"content": "<|im_start|>", "parse_special": False}).json()[
        "tokens"
    ]
    assert len(special) == 1 and len(literal) > 1


def test_detokenize_names_an_id_outside_the_vocabulary(http):
    reply = http.post("/detokenize", json={"tokens": [1, 2, 49152]})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "tokens[2]" and "49152" in error["message"]
    assert http.post("/tokenize", json={"add_special": True}).json()["error"]["param"] == "content"


def test_models_report_the_served_context(client, http):
    assert client.models.list().data[0].model_extra["max_model_len"] == CTX
    model_id = client.models.list().data[0].id
    assert http.get(f"/v1/models/{model_id}").json()["max_model_len"] == CTX


def test_llamacpp_metrics_move_after_a_completion(idle_server, client):
    before = scrape(idle_server)
    for name in (
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:prompt_tokens_seconds",
        "llamacpp:predicted_tokens_seconds",
        "llamacpp:kv_cache_usage_ratio",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
    ):
        assert (name, ()) in before, name
    assert ("llamacpp:tokens_drafted_total", ()) not in before  # only with --spec
    prompt = f"A fresh prompt {before[('llamacpp:prompt_tokens_total', ())]}: once upon a time"
    reply = client.completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0)
    after = scrape(idle_server)
    prefilled = reply.usage.prompt_tokens - reply.usage.prompt_tokens_details.cached_tokens
    assert (
        value(after, "llamacpp:prompt_tokens_total") - value(before, "llamacpp:prompt_tokens_total")
        == prefilled
    )
    moved = value(after, "llamacpp:tokens_predicted_total") - value(before, "llamacpp:tokens_predicted_total")
    assert moved == reply.usage.completion_tokens
    assert value(after, "llamacpp:prompt_tokens_seconds") > 0
    assert value(after, "llamacpp:predicted_tokens_seconds") > 0
    assert 0 < value(after, "llamacpp:kv_cache_usage_ratio") <= 1


# -- fill in the middle on Qwen2.5-Coder ----------------------------------------------------------
@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    """Qwen2.5-Coder, whose vocabulary has the FIM tokens, with --spec for the drafted series."""
    model = resolve_model(QWEN)  # the README's test command fetches it: missing is a failure
    server = start_lmserve(tmp_path_factory.mktemp("fim"), str(model), "--api-key", API_KEY, "--spec")
    yield server
    server.stop()


def test_suffix_fills_in_the_middle(qwen_server):
    with openai_client(qwen_server, timeout=600) as oai:
        reply = oai.completions.create(
            model="m", prompt=FIB_PREFIX, suffix=FIB_SUFFIX, max_tokens=24, temperature=0
        )
    text = reply.choices[0].text
    assert "if n" in text and "return" in text, text  # the base cases of the body
    # <|fim_prefix|>, <|fim_suffix|> and <|fim_middle|> around the plain tokens of both sides.
    tokenized = [
        post(qwen_server, "/tokenize", {"content": part}).json()["tokens"]
        for part in (FIB_PREFIX, FIB_SUFFIX)
    ]
    assert reply.usage.prompt_tokens == len(tokenized[0]) + len(tokenized[1]) + 3


def test_infill_answers_in_llama_cpp_shape(qwen_server):
    body = {
        "input_prefix": "def add(a, b):\n    ",
        "input_suffix": "\n\nprint(add(1, 2))\n",
        "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
        "n_predict": 12,
        "temperature": 0,
        "cache_prompt": True,  # llama.vscode's fields llama-server's scheduler reads: ignored
        "t_max_predict_ms": 500,
    }
    reply = post(qwen_server, "/infill", body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["content"].startswith("return a + b"), answer["content"]
    assert answer["stop"] is True and answer["tokens_predicted"] <= 12
    assert answer["stop_type"] in ("limit", "eos", "word") and answer["truncated"] is False
    assert answer["timings"]["predicted_n"] == answer["tokens_predicted"]
    # The repository pattern: <|repo_name|>myproject, <|file_sep|>util.py + its text,
    # <|file_sep|>filename, then the three FIM tokens around prefix and suffix.
    count = 0
    for part in ("myproject\n", "util.py\n", body["input_extra"][0]["text"], "filename\n"):
        count += len(post(qwen_server, "/tokenize", {"content": part}).json()["tokens"])
    for part in (body["input_prefix"], body["input_suffix"]):
        count += len(post(qwen_server, "/tokenize", {"content": part}).json()["tokens"])
    assert answer["tokens_evaluated"] == count + 3 + 3  # rep, two file_sep; pre, suf, mid
    streamed = post(qwen_server, "/infill", {**body, "stream": True})
    frames = [json.loads(data) for data in sse_data(streamed)]
    assert all(not f["stop"] for f in frames[:-1]) and frames[-1]["stop"] is True
    assert "".join(f["content"] for f in frames) == answer["content"]


def test_infill_refusals(qwen_server, idle_server):
    assert post(idle_server, "/infill", {"input_prefix": "a", "input_suffix": "b"}).json()["error"][
        "param"
    ] == ("input_suffix")  # SmolLM2: no FIM tokens
    bad = post(qwen_server, "/infill", {"input_prefix": "a", "input_extra": [{"filename": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input_extra[0].text"
    assert (
        post(qwen_server, "/infill", {"input_prefix": "a", "n_predict": 0}).json()["error"]["param"]
        == "n_predict"
    )


def test_spec_exports_the_drafted_series(qwen_server):
    code = "numbers = [1, 2, 3, 4, 5, 6, 7, 8]\nsquares = [1, 4, 9, 16, 25, 36, 49, 64]\n"
    post(
        qwen_server,
        "/v1/completions",
        {"prompt": code + code + "numbers = [1, 2,", "max_tokens": 24, "temperature": 0},
    )
    samples = scrape(qwen_server)
    drafted = value(samples, "llamacpp:tokens_drafted_total")
    accepted = value(samples, "llamacpp:tokens_drafted_accepted_total")
    assert ("llamacpp:tokens_drafted_total", ()) in samples
    assert 0 <= accepted <= drafted
