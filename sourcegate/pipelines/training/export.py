"""A trained checkpoint as the files the scorer reads: ONNX (fp32, or INT8 weights), its tokenizer, its recipe.

ONNX opset 17 with dynamic batch and sequence axes; INT8 by onnxruntime's dynamic quantisation; `ship` strips the
word-embedding table a model shares with the packaged cross-encoder (answer_support joins it back).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from sourcegate.pipelines.training.base_model import MAX_LENGTH

TOKENIZER_NAME = "tokenizer.json"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def _configure_tokenizer(tk, max_length: int = MAX_LENGTH):
    tk.no_padding()
    tk.enable_truncation(max_length=max_length, strategy="only_second")
    return tk


# What the exporters say on every export of this model, none of which applies to it (a user reading a training's
# output took them for faults): the tracer fixes the attention mask's padding branch, which one unpadded pair per run
# never takes; BERT indexes with no negative index; the quantiser suggests shape inference for image models.
BENIGN = ("Converting a tensor to a Python boolean", "Exporting aten::index operator of advanced indexing")
PREPROCESS_HINT = "Please consider to run pre-processing before quantization"


class _WithoutHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(PREPROCESS_HINT)


@contextmanager
def _quiet_exporters():
    """The BENIGN warnings and the quantiser's hint left out; every other warning is shown."""
    hint = _WithoutHint()
    logging.getLogger().addFilter(hint)
    try:
        with warnings.catch_warnings():
            for message in BENIGN:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        logging.getLogger().removeFilter(hint)


def export_fp32(model_dir: str | os.PathLike, out_path: str | os.PathLike, max_length: int = MAX_LENGTH) -> dict:
    """Export the HF checkpoint in ``model_dir`` to ONNX (opset 17; dynamic batch and sequence axes; int64
    inputs input_ids/attention_mask/token_type_ids; output logits). Writes tokenizer.json (no padding,
    only_second truncation at ``max_length``) beside it."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification

    model_dir, out_path = Path(model_dir), Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager")
    model.eval()

    class _Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits

    wrapper = _Logits(model).eval()
    dummy = tuple(torch.ones((2, 16), dtype=torch.int64) for _ in INPUT_NAMES)
    dyn = {n: {0: "batch", 1: "sequence"} for n in INPUT_NAMES}
    dyn["logits"] = {0: "batch"}
    with torch.no_grad(), _quiet_exporters():
        torch.onnx.export(
            wrapper,
            dummy,
            str(out_path),
            dynamo=False,
            opset_version=17,
            input_names=list(INPUT_NAMES),
            output_names=["logits"],
            dynamic_axes=dyn,
            do_constant_folding=True,
        )
    tk = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    _configure_tokenizer(tk, max_length)
    tk.save(str(out_path.parent / TOKENIZER_NAME))
    return {"fp32_onnx": str(out_path), "fp32_bytes": out_path.stat().st_size, "opset": 17}


def export_int8(
    model_dir: str | os.PathLike,
    out_path: str | os.PathLike,
    fp32_path: str | os.PathLike | None = None,
    max_length: int = MAX_LENGTH,
    per_channel: bool = False,
) -> dict:
    """`export_fp32` to ``fp32_path``, then dynamically quantise the weights to INT8 (QInt8; one scale per output
    channel with ``per_channel``) into ``out_path``, with tokenizer.json beside it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fp32_path = Path(fp32_path) if fp32_path else out_path.with_name("model.fp32.onnx")
    exported = export_fp32(model_dir, fp32_path, max_length)
    with _quiet_exporters():
        quantize_dynamic(str(fp32_path), str(out_path), weight_type=QuantType.QInt8, per_channel=per_channel)
    if fp32_path.parent != out_path.parent:
        (out_path.parent / TOKENIZER_NAME).write_bytes((fp32_path.parent / TOKENIZER_NAME).read_bytes())
    return {
        **exported,
        "int8_onnx": str(out_path),
        "int8_bytes": out_path.stat().st_size,
        "quantization": f"onnxruntime.quantization.quantize_dynamic, weight_type=QInt8, per_channel={per_channel}",
    }


def write_recipe(path: str | os.PathLike, recipe: dict) -> None:
    Path(path).write_text(json.dumps(recipe, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def versions() -> dict:
    """The packages that trained and exported a model, and the CPU's bf16 kernel its autocast ran on (another
    rounds otherwise: a retrain elsewhere is compared knowing it)."""
    from sourcegate.pipelines.build.embed_backends import bf16_kernel

    v = {"python": platform.python_version(), "numpy": np.__version__, "cpu_bf16_kernel": bf16_kernel()}
    for mod in ("torch", "transformers", "tokenizers", "onnxruntime", "onnx", "sklearn"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:
            v[mod] = None
    return v


def ship(int8_path: Path, out_path: Path) -> int:
    """The exported model without the word-embedding table it shares with the packaged cross-encoder
    (frozen in training, so equal to it; answer_support.assemble joins it back). Returns the bytes written."""
    import onnx
    from onnx import numpy_helper

    from sourcegate.pipelines.models import cross_encoder_dir
    from sourcegate.pipelines.retrieval.answer_support import SHARED

    model = onnx.load(str(int8_path))
    packaged = {i.name: i for i in onnx.load(str(cross_encoder_dir() / "model.onnx")).graph.initializer}
    rename = {f"m.{name}": name for name in SHARED}  # the export wrapper's prefix
    for init in model.graph.initializer:
        if init.name in rename and not np.array_equal(
            numpy_helper.to_array(init), numpy_helper.to_array(packaged[rename[init.name]])
        ):
            raise RuntimeError(f"{init.name} differs from the packaged model's: were the word embeddings frozen?")
    keep = [i for i in model.graph.initializer if i.name not in rename]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    for node in model.graph.node:
        node.input[:] = [rename.get(name, name) for name in node.input]
    onnx.save(model, str(out_path))
    return out_path.stat().st_size
