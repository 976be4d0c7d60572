"""The llama.cpp half of bench/engine.py, run by an interpreter where llama-cpp-python imports.

Reads JSON requests from stdin, one a line, and answers each with one JSON line (the op's wall
seconds, and the CPU seconds of all the worker's threads as ``cpu_seconds``):
``{"op": "load", "model": path, "threads": n, "n_ctx": n}`` (optional n_batch, n_ubatch,
flash_attn) -> ``{"seconds": load time}``;
``{"op": "prefill", "tokens": [...]}`` -> ``{"seconds": ...}`` (a fresh context each time);
``{"op": "decode", "first": id, "steps": n}`` -> ``{"seconds": ...}`` (one-token steps after
one prefilled token). A dev tool only: nothing in the project imports llama_cpp.
"""

from __future__ import annotations

import json
import sys
import time

import llama_cpp

state: dict = {}


def load(request: dict) -> float:
    t0 = time.perf_counter()
    state["llm"] = llama_cpp.Llama(
        model_path=request["model"],
        n_ctx=request["n_ctx"],
        n_batch=request.get("n_batch", request["n_ctx"]),
        n_ubatch=request.get("n_ubatch", 512),
        flash_attn=request.get("flash_attn", False),
        n_threads=request["threads"],
        n_threads_batch=request["threads"],
        verbose=False,
    )
    return time.perf_counter() - t0


def prefill(request: dict) -> float:
    llm = state["llm"]
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(request["tokens"])
    return time.perf_counter() - t0


def decode(request: dict) -> float:
    llm = state["llm"]
    llm.reset()
    llm.eval([request["first"]])
    token = request["first"]
    t0 = time.perf_counter()
    for _ in range(request["steps"]):
        llm.eval([token])
    return time.perf_counter() - t0


OPS = {"load": load, "prefill": prefill, "decode": decode}


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        cpu = time.process_time()
        seconds = OPS[request["op"]](request)
        print(json.dumps({"seconds": seconds, "cpu_seconds": time.process_time() - cpu}), flush=True)


if __name__ == "__main__":
    main()
