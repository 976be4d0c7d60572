"""Inkling's per-conversation state: the KV cache plus the rolling short-convolution inputs.

Each Inkling layer runs a depthwise causal convolution of ``K`` taps on four sites (the k and
v projections, the attention output, the FFN output). A site's next output needs its last
``K - 1`` inputs, so the cache carries them beside the K/V rows: ``K - 1`` rows per layer and
site, valid for the conversation's current end (:attr:`InklingCache.conv_at`). They only roll
forward: cutting the cache back to an earlier token cannot restore them, which is why the
family reuses no rows across requests (``Family.kv_reuse`` False: each request starts from
position 0) and does not speculate. A forward that starts anywhere else than where the
rolling state stands is refused rather than computed on a wrong state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kv_cache import KVCache, KVGeometry

SITES = ("k", "v", "attn", "mlp")  # the four convolved activations of a layer, in this order


@dataclass(frozen=True)
class ConvGeometry:
    """The rolling state's shape: taps, and each layer's k/v width (kv heads x head size)
    and hidden width."""

    taps: int
    kv_widths: tuple[int, ...]  # per layer
    hidden: int

    def widths(self, layer: int) -> tuple[int, int, int, int]:
        """The four sites' widths of one layer, in :data:`SITES` order."""
        kv = self.kv_widths[layer]
        return kv, kv, self.hidden, self.hidden


class InklingCache(KVCache):
    """A KVCache that also holds every layer's four rolling short-conv input states."""

    def __init__(self, geometry: KVGeometry, n_ctx: int, conv: ConvGeometry):
        super().__init__(geometry, n_ctx)
        self.conv = conv
        self.conv_state = [
            [np.zeros((conv.taps - 1, width), np.float32) for width in conv.widths(layer)]  # (K-1, width)
            for layer in range(geometry.n_layers)
        ]
        self.conv_at: int | None = 0  # the position the rolling state stands at (None: lost)

    def state(self, layer: int, site: str) -> np.ndarray:
        """The (K-1, width) rolling inputs of one layer's site (updated in place)."""
        return self.conv_state[layer][SITES.index(site)]

    def check_conv(self, start: int) -> None:
        """Refuse a forward at ``start`` unless the rolling state stands exactly there."""
        if self.conv_at != start:
            raise ValueError(
                f"inkling's short-conv state stands at position {self.conv_at}, not {start}: it only "
                "rolls forward, so a conversation cannot be cut back (no KV reuse, no speculation)"
            )

    def _clear_conv(self) -> None:
        for states in self.conv_state:
            for state in states:
                state[:] = 0.0
        self.conv_at = 0

    def truncate(self, n: int) -> None:
        """Forget tokens from the ``n``-th on; the rolling state survives only an empty cut
        (nothing forgotten) or a cut to zero (a fresh conversation)."""
        keep_state = n >= self.n_tokens
        super().truncate(n)
        if n == 0 and self.prefix_rows == 0:
            self._clear_conv()
        elif not keep_state:
            self.conv_at = None

    def install_prefix(self, prefix, key: str = "") -> None:
        """Only the empty prefix: rows with no token behind them carry no short-conv state."""
        if prefix is not None:
            raise ValueError("inkling cannot run behind a KV prefix (its short-conv state has no rows)")
        super().install_prefix(None, key)
        self._clear_conv()

    def copy_rows_from(self, other: KVCache, n: int) -> None:
        """Copy ``other``'s first ``n`` tokens; the rolling state comes along only with all of them."""
        super().copy_rows_from(other, n)
        if isinstance(other, InklingCache) and n == other.n_tokens and other.conv_at is not None:
            for mine, theirs in zip(self.conv_state, other.conv_state, strict=True):
                for a, b in zip(mine, theirs, strict=True):
                    a[:] = b
            self.conv_at = other.conv_at
        elif n == 0:
            self._clear_conv()
        else:
            self.conv_at = None

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(s.nbytes for states in self.conv_state for s in states)


def short_conv(x: np.ndarray, kernel: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Depthwise causal convolution with its residual over rows x (n, width):
    ``y[t] = x[t] + sum_j kernel[:, j] * in[t - (K-1) + j]``, where inputs before the first row
    come from ``state`` (the previous K-1 inputs, zeros on a fresh conversation); kernel is
    (width, K), tap K-1 multiplying the newest input. Updates ``state`` to the last K-1 inputs."""
    taps = kernel.shape[1]
    stream = np.concatenate([state, x], axis=0)  # (K-1 + n, width)
    y = x.copy()  # (n, width)
    n = x.shape[0]
    for j in range(taps):  # one fixed order of taps, whatever n is: a row's sum never depends on n
        y += kernel[:, j] * stream[j : j + n]
    state[:] = stream[n:]
    return y
