"""The fused int8 forward: N token rows through every layer and the head in one numba parallel
region (fused.py), its stages, work items and tiles, attention and the element-wise steps, with
the scalar functions llama.cpp computes its own way (ggml_math.py). Model families describe
their layers to it (LayerWeights); it knows no family."""
