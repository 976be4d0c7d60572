"""The gated delta rule of a DeltaNet layer (Qwen3.5's linear attention), token after token, in
numba. models/deltanet.py's ``delta_rule_reference`` is its numpy reference: the same float32
operations in the same order, so the two agree to the bit
(tests/inference/engine/fused/test_delta_rule.py).

The state of a value head is held key-major, S (head_k, head_v), so that every step is an
element-wise update of a contiguous row of head_v values:

    S[i] *= decay                      for each key index i, then recalled += S[i] * k[i]
    delta = (v - recalled) * beta
    S[i] += k[i] * delta               for each i, then out += S[i] * q[i]
    out *= scale

Each output value is a float32 sum over i in index order: the loops vectorize over the value
index without reassociating any sum (no fastmath, which would let LLVM reorder them or fuse
them into FMAs differently at each call site). A token's arithmetic is the same whether it
runs alone or among n rows, so prefill in one call, prefill in chunks and decode give the same
bits (path invariance).

Within a call, the next token's decay and recall ride on this token's update: row i is read
once per token, updated, added into ``out``, decayed by the next token's factor and added into
the next token's ``recalled``, instead of a second pass over the state to decay it. A call's
first recall only reads the state (its update pass takes the same decay product again, and a
later token's multiplies by an exact 1). Every value is the product or sum it was in two
passes, taken in the same order, so the bits do not move; a call's last token leaves its
state undecayed, as the next call's first token expects. One pass over each (head_k, head_v)
state a token instead of two, and one store instead of two in a decode step (figures in
docs/FAMILIES.md). Taking two or four key rows a pass (fewer loads and stores of ``acc`` and
``recalled``) keeps the bits too, but LLVM then leaves the loop scalar: 2-5x slower, tried.
So do blocks of 32 or 64 value columns run through every token (each column's recurrence is
its own, so a block could stay in L1): 40-120% slower at a released geometry, the shorter
inner loops costing more than the state's trips to L2.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(parallel=True, cache=True)
def delta_rule_heads(q, k, v, decay, beta, scale, state, out):
    """The gated delta rule over n tokens, one value head per parallel item, updating
    ``state`` (Hv, head_k, head_v) in place and writing ``out`` (n, Hv, head_v).

    q, k: (n, Hk, head_k), l2-normed; v: (n, Hv, head_v); decay (exp of the log decay) and
    beta: (n, Hv); scale: float32 1/sqrt(head_k). Value head h reads key head h % Hk. All
    arrays float32 and C-contiguous."""
    n, n_k, head_k = q.shape[0], q.shape[1], q.shape[2]
    n_v, head_v = state.shape[0], state.shape[2]
    if n == 0:
        return
    for h in numba.prange(n_v):
        s = state[h]  # (head_k, head_v)
        kh = h % n_k
        recalled = np.zeros(head_v, np.float32)  # (head_v,)
        delta = np.empty(head_v, np.float32)  # (head_v,)
        acc = np.empty(head_v, np.float32)  # (head_v,)
        # The first token's decayed state is only read here, for its recall; its update pass
        # multiplies by the decay again (the same product, the same bits) and stores it.
        first = decay[0, h]
        for i in range(head_k):
            ki = k[0, kh, i]
            for j in range(head_v):
                recalled[j] += (s[i, j] * first) * ki
        pending = first  # the decay the state still owes; 1 (exact) once a token has stored it
        for t in range(n):
            b = beta[t, h]
            for j in range(head_v):
                delta[j] = (v[t, h, j] - recalled[j]) * b
            acc[:] = np.float32(0.0)
            if t + 1 < n:
                d = decay[t + 1, h]
                recalled[:] = np.float32(0.0)
                for i in range(head_k):
                    ki, qi, k_next = k[t, kh, i], q[t, kh, i], k[t + 1, kh, i]
                    for j in range(head_v):
                        x = s[i, j] * pending + ki * delta[j]
                        acc[j] += x * qi
                        x = x * d
                        s[i, j] = x
                        recalled[j] += x * k_next
            else:
                for i in range(head_k):
                    ki, qi = k[t, kh, i], q[t, kh, i]
                    for j in range(head_v):
                        x = s[i, j] * pending + ki * delta[j]
                        s[i, j] = x
                        acc[j] += x * qi
            pending = np.float32(1.0)
            for j in range(head_v):
                out[t, h, j] = acc[j] * scale
