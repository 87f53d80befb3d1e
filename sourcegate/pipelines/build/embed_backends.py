"""The bi-encoder's backends (`embedding.backend`): torch in fp32 or bf16, or ONNX Runtime on an export made here.

`torch` is sentence-transformers (`sourcegate.pipelines.build.embed.Embedder`). `torch-bf16` runs the same
weights under bf16 autocast (the CPU's AMX / AVX512-BF16 units) in fixed shapes: every forward
pass is `ROWS` texts padded to one of `LENGTHS`, filled up with empty texts, so a text's vector
depends only on the text (its length picks the shape), never on its batch-mates; a dynamic
batch would move bf16 vectors by ~1e-3 with their neighbours. For `onnx`, with no model hub, `torch.onnx.export` turns the sentence-transformers folder's transformer into
`model.onnx` once, under a cache folder named by the weights' fingerprint and the variant, so a
rerun (or another worker) reuses it; `onnx-int8` is that export dynamically quantised
(`onnxruntime.quantization.quantize_dynamic`). Pooling stays out of the graph: the mean over
the attention mask and the L2 norm are done in numpy exactly as sentence-transformers does them,
with the model's own tokenizer truncating at its `max_seq_length`.

Texts are run one per session call, unpadded: dynamic quantisation scales activations over the
whole input tensor, so in a batch a text's vector would depend on its batch-mates (and on the
padding). One text per run makes every vector a function of its text alone, so a cached vector
equals a fresh one, in any order and any shard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
import warnings
from pathlib import Path

import numpy as np

from sourcegate.pipelines import models

log = logging.getLogger(__name__)

BACKENDS = ("torch", "torch-bf16", "onnx", "onnx-int8")
# Bump when the export or quantisation recipe changes: it is part of the folder name and the fingerprint.
RECIPE = {"exporter": "torch.onnx.export(dynamo=False)", "opset": 17, "version": 1}
INT8 = {"weight_type": "QInt8", "per_channel": True}
# torch-bf16's fixed shapes: rows per forward pass and the padded lengths (the last is the model's limit).
# 8 rows: the fastest of 2/4/8/16/32 on SciFact chunks here (docs/benchmarks/15-embed-backends.md).
BF16 = {"autocast": "bfloat16", "rows": 8, "lengths": [32, 64, 128, 256], "version": 1}
CACHE_ENV = "SOURCEGATE_MODEL_CACHE"  # where exports are kept; default ~/.cache/sourcegate/onnx


def load_embedder(model_id: str, model_path: str | None, batch_size: int, backend: str = "torch"):
    """The configured bi-encoder; every backend answers encode / encode_query / fingerprint / dimension."""
    check_backend(backend)
    if backend == "torch":
        from sourcegate.pipelines.build.embed import Embedder

        return Embedder(model_id, model_path, batch_size)
    if backend == "torch-bf16":
        return Bf16Embedder(model_id, model_path, batch_size)
    return OnnxEmbedder(model_id, model_path, batch_size, backend)


def fingerprint(model_path: str | None, backend: str = "torch") -> str:
    """The model fingerprint a config names, without loading (or exporting) the model."""
    return variant_fingerprint(models.fingerprint(models.embedding_model_path(model_path)), backend)


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"embedding.backend: {backend!r} is not one of {list(BACKENDS)}")


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else models.user_cache("onnx")


def variant_fingerprint(weights_fingerprint: str, backend: str, kernel: str | None = None) -> str:
    """The model fingerprint for a backend: the weights' own for torch, a derived one for the others.

    torch keeps the plain weights fingerprint, so vectors cached before backends existed stay valid.
    torch-bf16's also names the CPU's bf16 kernel (`bf16_kernel`, this machine's unless given): the
    same weights give other vectors on another kernel, so vectors and calibrations do not travel
    between them as if equal.
    """
    check_backend(backend)
    if backend == "torch":
        return weights_fingerprint
    recipe = {"weights": weights_fingerprint, "backend": backend, "recipe": BF16 if backend == "torch-bf16" else RECIPE}
    if backend == "torch-bf16":
        recipe["kernel"] = kernel or bf16_kernel()
    if backend == "onnx-int8":
        recipe["int8"] = INT8
    text = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def export_path(model_dir: Path, backend: str) -> Path:
    """Where this weights folder's export for `backend` lives (it may not exist yet)."""
    fp = variant_fingerprint(models.fingerprint(model_dir), backend)
    return cache_root() / f"{fp.removeprefix('sha256:')[:24]}-{backend}" / "model.onnx"


def ensure_export(model_dir: Path, backend: str) -> Path:
    """The cached export for `backend`, made first if missing (atomically: concurrent workers are safe)."""
    target = export_path(model_dir, backend)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".export-") as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        _export_fp32(model_dir, fp32)
        made = fp32
        if backend == "onnx-int8":
            made = Path(tmp) / "int8.onnx"
            _quantize(fp32, made)
        os.replace(made, target)
    log.info("embedding: exported %s for %s to %s", model_dir, backend, target)
    return target


def _export_fp32(model_dir: Path, out: Path) -> None:
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir)).eval()

    class Transformer(torch.nn.Module):  # keyword arguments only: transformers 5 rejects positional ones
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    ids = torch.ones((2, 8), dtype=torch.long)
    seq = {0: "batch", 1: "sequence"}
    # The TorchScript exporter warns about tracing transformers' mask code; the export is checked
    # against torch's vectors by tests/test_embed_backends.py instead.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Transformer(model),
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(out),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["token_embeddings"],
            dynamic_axes={"input_ids": seq, "attention_mask": seq, "token_type_ids": seq, "token_embeddings": seq},
            opset_version=RECIPE["opset"],
            dynamo=False,
        )


def _quantize(fp32: Path, out: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(out), weight_type=getattr(QuantType, INT8["weight_type"]), per_channel=True)


# oneDNN's cap on the instruction set it may use (either spelling), which changes bf16 kernels too.
ISA_CAP_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def bf16_kernel(cpuinfo: str | None = None, environ=None) -> str:
    """Which kernel does this CPU's bf16 matrix maths: `amx`, `avx512_bf16` or `emulated-<widest ISA>` (`avx512`,
    `avx2`, an ARM CPU's `bf16`, else the machine), plus any ISA cap.

    They round differently: the same 120 questions encoded here under oneDNN's default and capped
    at AVX512_CORE or AVX2 differ by up to 1.0e-3 per vector component (docs/benchmarks/15-embed-backends.md),
    enough to move a question across a threshold placed at its neighbour's score. Emulation too rounds by the
    instruction set it runs on (an AVX-512 CPU without bf16 against an AVX2 one), so it is named by it.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    env = os.environ if environ is None else environ
    kernel = "amx" if " amx_bf16" in cpuinfo else "avx512_bf16" if " avx512_bf16" in cpuinfo else emulated(cpuinfo)
    cap = next((env[k] for k in ISA_CAP_ENV if env.get(k)), None)
    return f"{kernel}@{cap.upper()}" if cap else kernel


def emulated(cpuinfo: str) -> str:
    """`emulated-<the widest instruction set emulation runs on>`, read from /proc/cpuinfo's flags (x86) or
    Features (ARM)."""
    flags = set(cpuinfo.split())
    isa = next((name for flag, name in EMULATION_ISA if flag in flags), None) or platform.machine() or "unknown"
    return f"emulated-{isa}"


EMULATION_ISA = (("avx512f", "avx512"), ("avx2", "avx2"), ("bf16", "arm-bf16"), ("asimd", "arm"))


def native_bf16() -> bool:
    """Whether this CPU does bf16 matrix maths in hardware (AMX or AVX512-BF16); elsewhere it is emulated, slowly."""
    return not bf16_kernel(environ={}).startswith("emulated")


class _Variant:
    """What every non-default variant shares: its own fingerprint, a query as a one-text batch, the tokenizer."""

    path: Path
    backend: str

    @property
    def fingerprint(self) -> str:
        return variant_fingerprint(models.fingerprint(self.path), self.backend)

    def encode_query(self, text: str) -> np.ndarray:
        return self.encode([text])[0]

    @property
    def tokenizer(self):
        return models.tokenizer(str(self.path))


class Bf16Embedder(_Variant):
    """sentence-transformers' weights under bf16 autocast in fixed shapes; same interface as `Embedder`. A plain
    model folder is loaded without sentence-transformers (`plain_transformer`), any other through it."""

    def __init__(self, model_id: str, model_path: str | None = None, batch_size: int = 32):
        if not native_bf16():
            log.warning(
                "embedding.backend torch-bf16: this CPU has no native bf16 (AMX / AVX512-BF16); it will be slow"
            )
        self.model_id, self.path, self.batch_size = model_id, models.embedding_model_path(model_path), batch_size
        self.backend = "torch-bf16"
        self._encoder = plain_transformer(self.path)
        if self._encoder:
            self.max_tokens = models.max_seq_length(self.path)
            self.dimension = self._encoder.hidden_size  # mean pooling keeps the width
        else:
            from sourcegate.pipelines.build.embed import Embedder

            loaded = Embedder(model_id, model_path, batch_size)
            transformer = loaded.model[0]
            self._encoder = Transformers(transformer.auto_model.eval(), transformer.tokenizer)
            self.max_tokens, self.dimension = loaded.max_tokens, loaded.dimension
        self.lengths = [n for n in BF16["lengths"] if n < self.max_tokens] + [self.max_tokens]

    @property
    def code(self) -> tuple:
        """The code a text goes through to its vector besides the weights: kept vectors are bound to it."""
        return (type(self), type(self._encoder), *getattr(self._encoder, "CODE", ()))

    def shape_lengths(self, texts: list[str]) -> list[int]:
        """The padded length of the forward pass each text goes through: the first that holds it."""
        ids = self._encoder.token_ids(list(texts), self.max_tokens)
        return [next(length for length in self.lengths if length >= len(one)) for one in ids]

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        by_length: dict[int, list[int]] = {}
        for i, length in enumerate(self.shape_lengths(texts) if texts else []):
            by_length.setdefault(length, []).append(i)
        rows = BF16["rows"]
        for length, members in sorted(by_length.items()):
            for start in range(0, len(members), rows):
                batch = members[start : start + rows]
                out[batch] = self._forward([texts[i] for i in batch], length)[: len(batch)]
        return out

    def _forward(self, texts: list[str], length: int) -> np.ndarray:
        import torch

        filled = list(texts) + [""] * (BF16["rows"] - len(texts))
        enc = self._encoder.padded(filled, length)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            tokens = self._encoder.hidden(enc)
        mask = enc["attention_mask"].unsqueeze(-1).float()
        pooled = (tokens.float() * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=1).numpy()


class Transformers:
    """A `transformers` model and tokenizer as the bf16 embedder asks them (the shape of bert.Encoder)."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.hidden_size = int(model.config.hidden_size)

    def token_ids(self, texts: list[str], max_length: int) -> list[list[int]]:
        return self.tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]

    def padded(self, texts: list[str], length: int) -> dict:
        return self.tokenizer(texts, padding="max_length", truncation=True, max_length=length, return_tensors="pt")

    def hidden(self, batch):
        return self.model(**batch).last_hidden_state


def plain_transformer(path: Path):
    """The encoder of a plain sentence-transformers folder (its Transformer at the root, then Pooling (mean only) and
    Normalize, no lower-casing), loaded without sentence-transformers: a plain BERT in this project's own forward
    pass (bert.py: no `transformers` import, about 3 s of a cold `query`), another architecture by `transformers`.
    Else None (load it through sentence-transformers). The pooling is this module's, so the vectors are the same to
    the bit (tests/test_embed_backends.py)."""
    try:
        modules = json.loads((path / "modules.json").read_text())
        settings = json.loads((path / "sentence_bert_config.json").read_text())
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        if kinds != ["Transformer", "Pooling", "Normalize"] or modules[0]["path"] or settings.get("do_lower_case"):
            return None
        pooling = json.loads((path / modules[1]["path"] / "config.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if [k for k, on in pooling.items() if k.startswith("pooling_mode") and on] != ["pooling_mode_mean_tokens"]:
        return None
    from sourcegate.pipelines.build import bert

    encoder = bert.load(path)
    if encoder is not None:
        return encoder
    from transformers import AutoModel, AutoTokenizer

    return Transformers(AutoModel.from_pretrained(str(path)).eval(), AutoTokenizer.from_pretrained(str(path)))


class OnnxEmbedder(_Variant):
    """Same interface as `sourcegate.pipelines.build.embed.Embedder`; vectors are unit-norm float32."""

    def __init__(self, model_id: str, model_path: str | None = None, batch_size: int = 32, backend: str = "onnx"):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        check_backend(backend)
        if not backend.startswith("onnx"):
            raise ValueError(f"embedding.backend: {backend!r} is not an ONNX variant (use load_embedder)")
        self.model_id = model_id
        self.backend = backend
        self.path = models.embedding_model_path(model_path)
        self.batch_size = batch_size  # kept for the interface: texts are run one at a time (see the module doc)
        self.max_tokens = models.max_seq_length(self.path)
        self.onnx_path = ensure_export(self.path, backend)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(self.onnx_path), options, providers=["CPUExecutionProvider"])
        self._tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self._tok.enable_truncation(self.max_tokens)
        self._tok.no_padding()
        self.dimension = int(self.encode(["dimension probe"]).shape[1])

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, getattr(self, "dimension", 0)), dtype=np.float32)
        return np.stack([self._one(enc) for enc in self._tok.encode_batch(list(texts))])

    def _one(self, enc) -> np.ndarray:
        ids = np.asarray([enc.ids], np.int64)
        mask = np.asarray([enc.attention_mask], np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.asarray([enc.type_ids], np.int64)}
        tokens = self.session.run(None, feed)[0][0]
        return mean_pool_normalize(tokens, mask[0])


def mean_pool_normalize(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' Pooling(mean) then Normalize, for one text: (seq, dim) -> (dim,) float32."""
    m = mask.astype(np.float32)[:, None]
    pooled = (tokens * m).sum(axis=0) / max(float(m.sum()), 1e-9)
    return (pooled / max(float(np.linalg.norm(pooled)), 1e-12)).astype(np.float32)
