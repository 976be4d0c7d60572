"""How a loaded model turns a request into events: the generation backends (and their
registry), the reply emitter, constrained decoding and tool-call capture."""
