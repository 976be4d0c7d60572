"""Training a KV prefix (a cartridge) through the frozen model: a float32 numpy forward of
the decoder families with a trainable prefix, and its backward to the prefix's keys and values.

The exact serving forward (``models/``) rounds as llama.cpp does (quantized activations, an f16
cache, f16 probabilities); gradients need a smooth function, so training runs its own float32
forward over the dequantized weights (``weights.py``), whose logits agree with the exact
engine's to a tolerance the tests state, and whose backward (``backward.py``) is checked op by
op and end to end against finite differences.
"""

from .forward import PrefixForward, Tape
from .weights import TrainingWeights, training_weights

__all__ = ["PrefixForward", "Tape", "TrainingWeights", "training_weights"]
