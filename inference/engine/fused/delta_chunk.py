"""The gated delta rule in its chunked (parallel) form: measured against the token-by-token
kernel (fused/delta_rule.py) and kept off the serving path. Nothing in the model calls it.

Why it is not used (docs/FAMILIES.md has the figures):

- It is not faster here. Over a chunk of C tokens the chunked form does the recurrence's work
  as products with the chunk's start state (K S0, Q S0, K^T D: 6 float operations per state
  element a token against the recurrence's 7) plus C x C work inside the chunk. It wins where those
  products run as register-tiled GEMMs (a GPU, a BLAS). numba without BLAS (no scipy here)
  writes them as loops over rows, each as load/store-bound as the recurrence's own loops; on
  two cores the numba kernel is slower than the token-by-token one at every chunk size tried.
- It is a different arithmetic. A token's output sums the same terms in another order, so it
  parts from the recurrence by a few float32 roundings (a bound the tests hold). A decode step
  is one token, always the recurrence's arithmetic; using the chunked form in prefill only
  would make a token's logits depend on whether it was prefilled or decoded, which the engine
  does not allow (one exact arithmetic whatever the rows run with). It would also cost the
  bit-exact match with llama.cpp, whose CPU op runs the recurrence.

The form (per value head, a chunk starting from state S0, G_t the running sum of the log
decays g inside the chunk, so exp(G_t - G_s) is the decay from token s to token t):

    delta_t = beta_t (v_t - exp(G_t) S0^T k_t - sum_{s<t} exp(G_t - G_s) (k_t . k_s) delta_s)
    out_t   = scale (exp(G_t) S0^T q_t + sum_{s<=t} exp(G_t - G_s) (q_t . k_s) delta_s)
    S_C     = exp(G_last) S0 + sum_s exp(G_last - G_s) k_s delta_s^T

which unrolls S_t = exp(g_t) S_{t-1} + k_t delta_t^T exactly (real arithmetic): the deltas
come from a forward substitution over the chunk (the WY / UT transform's triangular solve,
done row by row), everything else is a product. Only differences of G are exponentiated, so
strong decays underflow to 0 rather than dividing by it.
"""

from __future__ import annotations

import numba
import numpy as np

CHUNK = 64  # tokens a chunk (llama.cpp's and the reference implementation's size)


@numba.njit(parallel=True, cache=True)
def delta_chunk_heads(q, k, v, g, beta, scale, chunk, state, out):
    """The gated delta rule over n tokens in chunks of ``chunk``, one value head per parallel
    item, updating ``state`` (Hv, head_k, head_v) in place and writing ``out`` (n, Hv, head_v).

    q, k: (n, Hk, head_k), l2-normed; v: (n, Hv, head_v); g (log decay) and beta: (n, Hv);
    scale: float32 1/sqrt(head_k). Value head h reads key head h % Hk. All arrays float32 and
    C-contiguous."""
    n, n_k, head_k = q.shape[0], q.shape[1], q.shape[2]
    n_v, head_v = state.shape[0], state.shape[2]
    for h in numba.prange(n_v):
        s0 = state[h]  # (head_k, head_v)
        kh = h % n_k
        ks = np.empty((chunk, head_v), np.float32)  # (C, head_v) S0^T k_t
        qs = np.empty((chunk, head_v), np.float32)  # (C, head_v) S0^T q_t
        deltas = np.empty((chunk, head_v), np.float32)  # (C, head_v)
        kk = np.empty((chunk, chunk), np.float32)  # (C, C) k_t . k_s, s <= t
        qk = np.empty((chunk, chunk), np.float32)  # (C, C) q_t . k_s, s <= t
        k_t = np.empty((head_k, chunk), np.float32)  # (head_k, C) the chunk's keys, key-major
        cum = np.empty(chunk, np.float32)  # (C,) G_t
        row = np.empty(head_v, np.float32)  # (head_v,)
        for c0 in range(0, n, chunk):
            m = min(chunk, n - c0)
            total = np.float32(0.0)
            for t in range(m):
                total += g[c0 + t, h]
                cum[t] = total
                for i in range(head_k):
                    k_t[i, t] = k[c0 + t, kh, i]
            # S0's products, row i of S0 read once for every token of the chunk.
            ks[:m] = np.float32(0.0)
            qs[:m] = np.float32(0.0)
            for i in range(head_k):
                for t in range(m):
                    ki, qi = k[c0 + t, kh, i], q[c0 + t, kh, i]
                    for j in range(head_v):
                        ks[t, j] += ki * s0[i, j]
                        qs[t, j] += qi * s0[i, j]
            kk[:m, :m] = np.float32(0.0)
            qk[:m, :m] = np.float32(0.0)
            for t in range(m):
                for i in range(head_k):
                    ki, qi = k[c0 + t, kh, i], q[c0 + t, kh, i]
                    for s in range(t + 1):
                        kk[t, s] += ki * k_t[i, s]
                        qk[t, s] += qi * k_t[i, s]
            # The forward substitution: delta_t needs every earlier delta of the chunk.
            for t in range(m):
                decay_t = np.exp(cum[t])
                for j in range(head_v):
                    row[j] = v[c0 + t, h, j] - decay_t * ks[t, j]
                for s in range(t):
                    c = np.exp(cum[t] - cum[s]) * kk[t, s]
                    for j in range(head_v):
                        row[j] -= c * deltas[s, j]
                b = beta[c0 + t, h]
                for j in range(head_v):
                    deltas[t, j] = b * row[j]
                for j in range(head_v):
                    row[j] = decay_t * qs[t, j]
                for s in range(t + 1):
                    c = np.exp(cum[t] - cum[s]) * qk[t, s]
                    for j in range(head_v):
                        row[j] += c * deltas[s, j]
                for j in range(head_v):
                    out[c0 + t, h, j] = row[j] * scale
            last = cum[m - 1]
            decay_last = np.exp(last)
            for s in range(m):
                cum[s] = np.exp(last - cum[s])  # now the decay from token s to the chunk's end
            for i in range(head_k):
                for j in range(head_v):
                    s0[i, j] *= decay_last
                for s in range(m):
                    w = cum[s] * k_t[i, s]
                    for j in range(head_v):
                        s0[i, j] += w * deltas[s, j]


def delta_rule_chunked(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    chunk: int = CHUNK,
) -> np.ndarray:
    """models.deltanet.delta_rule's contract in chunks of ``chunk`` tokens (the numba kernel):
    updates ``state`` (Hv, head_k, head_v) in place, returns (n, Hv, head_v). Within a float32
    bound of the recurrence, not its bits (see the module docstring)."""
    n, n_v, head_v = q.shape[0], state.shape[0], state.shape[2]
    out = np.empty((n, n_v, head_v), np.float32)  # (n, Hv, head_v)
    delta_chunk_heads(
        np.ascontiguousarray(q, np.float32),
        np.ascontiguousarray(k, np.float32),
        np.ascontiguousarray(v, np.float32),
        np.ascontiguousarray(g, np.float32),
        np.ascontiguousarray(beta, np.float32),
        np.float32(1.0 / np.sqrt(np.float32(state.shape[1]))),
        chunk,
        state,
        out,
    )
    return out


def delta_rule_chunked_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    chunk: int = CHUNK,
) -> np.ndarray:
    """:func:`delta_rule_chunked` in numpy, every head at once, the products as batched
    matmuls (BLAS): the kernel's reference up to summation order (a float32 bound, not bits)."""
    n, n_k = q.shape[0], q.shape[1]
    n_v, head_k, head_v = state.shape
    heads = np.arange(n_v) % n_k
    scale = np.float32(1.0 / np.sqrt(np.float32(head_k)))
    out = np.empty((n, n_v, head_v), np.float32)  # (n, Hv, head_v)
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        m = c1 - c0
        qc = np.ascontiguousarray(q[c0:c1, heads].transpose(1, 0, 2))  # (Hv, m, head_k)
        kc = np.ascontiguousarray(k[c0:c1, heads].transpose(1, 0, 2))  # (Hv, m, head_k)
        vc = v[c0:c1].transpose(1, 0, 2)  # (Hv, m, head_v)
        cum = np.cumsum(np.asarray(g[c0:c1], np.float32).T, axis=1, dtype=np.float32)  # (Hv, m)
        causal = np.tril(np.ones((m, m), bool))  # (m, m) s <= t
        # exp(G_t - G_s) where s <= t (never above 1), 0 elsewhere
        rel = np.where(causal, np.exp(np.minimum(cum[:, :, None] - cum[:, None, :], 0)), 0)  # (Hv, m, m)
        rel = rel.astype(np.float32)
        kk = (kc @ kc.transpose(0, 2, 1)) * rel  # (Hv, m, m)
        qk = (qc @ kc.transpose(0, 2, 1)) * rel  # (Hv, m, m)
        decay = np.exp(cum)  # (Hv, m)
        rhs = vc - decay[:, :, None] * (kc @ state)  # (Hv, m, head_v)
        deltas = np.empty((n_v, m, head_v), np.float32)  # (Hv, m, head_v)
        for t in range(m):
            recalled = np.einsum("hs,hsj->hj", kk[:, t, :t], deltas[:, :t])  # (Hv, head_v)
            deltas[:, t] = beta[c0 + t][:, None] * (rhs[:, t] - recalled)
        out[c0:c1] = ((decay[:, :, None] * (qc @ state) + qk @ deltas) * scale).transpose(1, 0, 2)
        to_end = np.exp(cum[:, -1:] - cum)  # (Hv, m)
        state *= decay[:, -1, None, None]
        state += (kc * to_end[:, :, None]).transpose(0, 2, 1) @ deltas
    return out
