"""Admin forms: start a cartridge build from an uploaded corpus; try a query on a fleet."""

from __future__ import annotations

import re

from django import forms

from fleet.cartridges.train import DEFAULT_LR

MAX_CORPUS_BYTES = 32 * 2**20
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class CartridgeBuildForm(forms.Form):
    corpus = forms.FileField(help_text="a UTF-8 text file (at most 32 MiB)")
    name = forms.CharField(max_length=100, help_text="the cartridge's file name, without .safetensors")
    model = forms.CharField(required=False, help_text="GGUF path or model name; empty: the default model")
    prefix_tokens = forms.IntegerField(min_value=1, max_value=65536, initial=256, label="Prefix tokens (p)")
    steps = forms.IntegerField(
        min_value=0,
        initial=0,
        help_text="optimizer steps (with minutes: at most this many); 0 and no minutes: untrained",
    )
    minutes = forms.FloatField(
        min_value=0,
        initial=0,
        help_text="time budget for synthesis and training; the best held-out checkpoint is saved (0: none)",
    )
    lr = forms.FloatField(min_value=1e-8, initial=DEFAULT_LR, label="Learning rate")
    seed = forms.IntegerField(min_value=0, initial=0)

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].removesuffix(".safetensors")
        if not NAME.match(name):
            raise forms.ValidationError(
                "letters, digits, '.', '_' and '-' only, starting with a letter or digit"
            )
        return name

    def clean_corpus(self):
        upload = self.cleaned_data["corpus"]
        if upload.size > MAX_CORPUS_BYTES:
            raise forms.ValidationError(f"the corpus is {upload.size} bytes; at most {MAX_CORPUS_BYTES}")
        data = upload.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise forms.ValidationError(
                f"the corpus is not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from exc
        if not text.strip():
            raise forms.ValidationError("the corpus is empty")
        upload.seek(0)
        return upload


class FleetQueryForm(forms.Form):
    text = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 80}), label="Query")
    rag_chunks = forms.IntegerField(min_value=1, max_value=256, initial=8, label="Top chunks (--rag-chunks)")
    rag_docs = forms.IntegerField(min_value=1, max_value=64, initial=2, label="Documents (--rag-docs)")
