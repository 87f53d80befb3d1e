"""The bi-encoder's variants (torch bf16, ONNX Runtime fp32 and INT8) against torch fp32: same vectors
(within a stated tolerance), each text's vector a function of the text alone, their own fingerprints
(so the embed cache re-embeds on a switch), an ONNX export made once and reused."""

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from sourcegate.artifact_io.run_folder import RunFolder
from sourcegate.pipelines import models
from sourcegate.pipelines.app import steps
from sourcegate.pipelines.build import embed_backends
from sourcegate.pipelines.build.embed_backends import BACKENDS, load_embedder, variant_fingerprint

# A handful of texts: short, medium, and one past the model's 256-token window (truncated alike).
TEXTS = [
    "what causes croup",
    "Croup is a respiratory infection of the upper airway, usually caused by the parainfluenza virus.",
    "The French Revolution began in 1789 with the storming of the Bastille and ended the absolute monarchy.",
    "BM25 ranks documents by term frequency, inverse document frequency and document length normalisation.",
    " ".join(f"Sentence {i} repeats the word mitochondria and the number {i * 7}." for i in range(60)),
]
# Measured on 1,000 SciFact chunks (docs/benchmarks/15-embed-backends.md): fp32 cosine to torch >= 0.9999998;
# INT8 (dynamic, per-channel weights) min 0.9898; torch bf16 (fixed shapes) min 0.99998 on 200 of them.
# The bounds leave room, not a different model.
FP32_MIN_COSINE = 0.9999
BF16_MIN_COSINE = 0.999
INT8_MIN_COSINE = 0.98
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
VARIANTS = [("onnx", FP32_MIN_COSINE), ("torch-bf16", BF16_MIN_COSINE), ("onnx-int8", INT8_MIN_COSINE)]


@pytest.fixture(scope="module")
def torch_fp32():
    """The reference: sentence-transformers in fp32, whatever the configured default is."""
    return load_embedder(MODEL, None, 32, "torch")


@pytest.fixture(scope="module")
def onnx_embedders(tmp_path_factory):
    """Both ONNX variants, exported once into a cache folder of this module's own, and torch bf16."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(embed_backends.CACHE_ENV, str(tmp_path_factory.mktemp("onnx-cache")))
        yield {b: load_embedder(MODEL, None, 32, b) for b, _ in VARIANTS}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.models
@pytest.mark.parametrize("backend, bound", VARIANTS)
def test_variant_vectors_match_torch(torch_fp32, onnx_embedders, backend, bound):
    onnx = onnx_embedders[backend]
    assert onnx.dimension == torch_fp32.dimension == 384 and onnx.max_tokens == torch_fp32.max_tokens == 256
    got, want = onnx.encode(TEXTS), torch_fp32.encode(TEXTS)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert cosines(got, want).min() >= bound
    # each text is nearest its own torch vector: the variants agree on what is similar to what
    assert (np.argmax(got @ want.T, axis=1) == np.arange(len(TEXTS))).all()


@pytest.mark.models
@pytest.mark.parametrize("backend", [b for b, _ in VARIANTS])
def test_a_text_gets_the_same_vector_alone_in_any_order_and_again(onnx_embedders, backend):
    onnx = onnx_embedders[backend]
    together = onnx.encode(TEXTS)
    alone = np.stack([onnx.encode([t])[0] for t in TEXTS])
    reversed_ = onnx.encode(TEXTS[::-1])[::-1]
    np.testing.assert_array_equal(together, alone)  # a cached vector equals a fresh one
    np.testing.assert_array_equal(together, reversed_)
    np.testing.assert_array_equal(together, onnx.encode(TEXTS))
    np.testing.assert_array_equal(onnx.encode_query(TEXTS[0]), together[0])
    many = TEXTS * 3  # more texts of one shape than one forward pass holds
    np.testing.assert_array_equal(onnx.encode(many), np.concatenate([together] * 3))


@pytest.mark.models
def test_bf16_pads_each_text_to_the_first_fixed_length_that_holds_it(onnx_embedders):
    bf16 = onnx_embedders["torch-bf16"]
    assert bf16.lengths == embed_backends.BF16["lengths"] and bf16.lengths[-1] == bf16.max_tokens
    assert bf16.shape_lengths([TEXTS[0], TEXTS[1], TEXTS[-1]]) == [32, 32, 256]
    assert bf16.encode([]).shape == (0, 384)


@pytest.mark.models
def test_bf16_loads_a_plain_model_without_sentence_transformers_and_gets_the_same_vectors(onnx_embedders, monkeypatch):
    bf16 = onnx_embedders["torch-bf16"]
    assert embed_backends.plain_transformer(bf16.path) is not None  # the packaged model is a plain one
    monkeypatch.setattr(embed_backends, "plain_transformer", lambda path: None)  # the sentence-transformers way
    through_st = load_embedder(MODEL, None, 32, "torch-bf16")
    assert (through_st.dimension, through_st.max_tokens) == (bf16.dimension, bf16.max_tokens) == (384, 256)
    assert through_st.fingerprint == bf16.fingerprint
    texts = TEXTS + ["", "a"]
    np.testing.assert_array_equal(through_st.encode(texts), bf16.encode(texts))


@pytest.mark.models
@pytest.mark.parametrize("bf16", [True, False])
def test_the_plain_bert_forward_is_transformers_bertmodel_to_the_bit(bf16):
    """bert.py's forward and tokenizer against transformers' BertModel and fast tokenizer, in the embedder's fixed
    shapes, padded batches and over-long texts included: the same token ids and the same hidden states."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from sourcegate.pipelines.build import bert

    path = models.embedding_model_path(None)
    reference, reference_tokenizer = AutoModel.from_pretrained(str(path)).eval(), AutoTokenizer.from_pretrained(path)
    encoder = bert.load(path)
    texts = TEXTS + ["", "a", "Ünïcödé café — “quotes” 中文", "word " * 600]
    for length in embed_backends.BF16["lengths"] + [256]:
        for start in range(0, len(texts), 8):
            batch = (texts[start : start + 8] + [""] * 8)[:8]
            want = reference_tokenizer(
                batch, padding="max_length", truncation=True, max_length=length, return_tensors="pt"
            )
            got = encoder.padded(batch, length)
            assert all(torch.equal(got[k], want[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                assert torch.equal(encoder.hidden(got), reference(**want).last_hidden_state)
    assert encoder.token_ids(texts, 256) == reference_tokenizer(texts, truncation=True, max_length=256)["input_ids"]


@pytest.mark.models
def test_the_bf16_embedder_loads_without_importing_transformers():
    """What a cold `query` and every night task that embeds no longer pay for (docs/benchmarks/26-serve.md)."""
    code = (
        "import sys; from sourcegate.pipelines.build.embed_backends import load_embedder; "
        f"e = load_embedder({MODEL!r}, None, 32, 'torch-bf16'); e.encode(['a question']); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'sentence_transformers')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_a_bert_folder_this_project_does_not_compute_exactly_is_left_to_transformers(tmp_path):
    from sourcegate.pipelines.build import bert

    config = {"model_type": "bert", "architectures": ["BertModel"], "hidden_act": "gelu"}
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_bytes(b"")
    for changed in ({}, {"hidden_act": "gelu_new"}, {"model_type": "roberta"}, {"is_decoder": True}):
        (tmp_path / "config.json").write_text(json.dumps(config | changed))
        assert (bert.readable(tmp_path) is not None) == (changed == {})
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert bert.readable(tmp_path) is None  # no tokenizer.json: transformers' tokenizer


def plain_folder(tmp_path, modules=("Transformer", "Pooling", "Normalize"), root="", lower=False, mode="mean_tokens"):
    """A sentence-transformers folder's descriptors (no weights): what `plain_transformer` reads to decide."""
    entries = [
        {
            "idx": i,
            "name": str(i),
            "path": root if kind == "Transformer" else f"{i}_{kind}",
            "type": f"sentence_transformers.models.{kind}",
        }
        for i, kind in enumerate(modules)
    ]
    (tmp_path / "modules.json").write_text(json.dumps(entries))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": lower}))
    pooling = {f"pooling_mode_{m}": m == mode for m in ("cls_token", "mean_tokens", "max_tokens")}
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 384} | pooling))
    return tmp_path


@pytest.mark.parametrize(
    "folder",
    [
        {"modules": ("Transformer", "Pooling", "Dense", "Normalize")},  # a projection after pooling
        {"modules": ("Transformer", "Pooling")},  # not normalised
        {"root": "0_Transformer"},  # the transformer in a subfolder
        {"lower": True},  # lower-cases before tokenising
        {"mode": "cls_token"},  # another pooling
    ],
)
def test_a_model_that_is_not_plain_goes_through_sentence_transformers(tmp_path, folder):
    # A TypeError or a transformers import here would mean the check loaded a model it should have refused.
    assert embed_backends.plain_transformer(plain_folder(tmp_path, **folder)) is None


def test_a_folder_without_sentence_transformers_files_is_not_plain(tmp_path):
    assert embed_backends.plain_transformer(tmp_path) is None


@pytest.mark.models
def test_the_export_is_made_once_and_reused(onnx_embedders):
    onnx = onnx_embedders["onnx-int8"]
    made = onnx.onnx_path.stat().st_mtime_ns
    again = embed_backends.ensure_export(onnx.path, "onnx-int8")
    assert again == onnx.onnx_path and again.stat().st_mtime_ns == made
    assert onnx_embedders["onnx"].onnx_path.parent != onnx.onnx_path.parent
    assert onnx.onnx_path.parent.parent == embed_backends.cache_root()  # under the configured cache folder


@pytest.mark.models
def test_switching_backend_re_embeds_everything(make_cfg, small_corpus, torch_fp32, onnx_embedders):
    cfg = make_cfg(**{"corpus.path": str(small_corpus), "embedding.backend": "torch"})
    steps.ingest_step(RunFolder(cfg.artifacts, "r1"), cfg)
    n = steps.chunk_step(RunFolder(cfg.artifacts, "r1"), cfg.chunking, cfg.embedding)
    first = steps.embed_step(RunFolder(cfg.artifacts, "r1"), cfg.embedding, embedder=torch_fp32)
    steps.merge_step(RunFolder(cfg.artifacts, "r1"), cfg.embedding, [first])
    onnx_cfg = make_cfg(**{"corpus.path": str(small_corpus), "embedding.backend": "onnx", "artifacts": cfg.artifacts})
    assert steps.embedding_fingerprint(onnx_cfg) == onnx_embedders["onnx"].fingerprint != torch_fp32.fingerprint
    steps.ingest_step(RunFolder(onnx_cfg.artifacts, "r2"), onnx_cfg)
    steps.chunk_step(RunFolder(onnx_cfg.artifacts, "r2"), onnx_cfg.chunking, onnx_cfg.embedding)
    second = steps.embed_step(RunFolder(onnx_cfg.artifacts, "r2"), onnx_cfg.embedding, embedder=onnx_embedders["onnx"])
    assert first["encoded"] == n and second["encoded"] == n and second["reused"] == 0


def test_each_backend_is_its_own_fingerprint():
    weights = "sha256:" + "ab" * 32
    prints = {b: variant_fingerprint(weights, b) for b in BACKENDS}
    assert prints["torch"] == weights  # vectors cached before backends existed stay valid for torch
    assert len(set(prints.values())) == len(BACKENDS)
    assert variant_fingerprint("sha256:" + "cd" * 32, "onnx") != prints["onnx"]  # new weights, new export
    assert {b: variant_fingerprint(weights, b) for b in BACKENDS} == prints  # a function of its inputs


def test_bf16_fingerprint_names_the_cpus_kernel():
    weights = "sha256:" + "ab" * 32
    amx = embed_backends.bf16_kernel(" fpu avx512_bf16 amx_bf16 amx_tile", environ={})
    avx = embed_backends.bf16_kernel(" fpu avx512f avx512_bf16", environ={})
    none = embed_backends.bf16_kernel(" fpu avx2", environ={})
    capped = embed_backends.bf16_kernel(" fpu avx512_bf16 amx_bf16", environ={"ONEDNN_MAX_CPU_ISA": "avx2"})
    assert (amx, avx, none, capped) == ("amx", "avx512_bf16", "emulated-avx2", "amx@AVX2")
    # emulation rounds by the instruction set it runs on: an AVX-512 CPU without bf16 is not an AVX2 one
    wide = embed_backends.bf16_kernel(" fpu avx2 avx512f", environ={})
    arm = embed_backends.bf16_kernel("Features\t: fp asimd bf16", environ={})
    assert (wide, arm) == ("emulated-avx512", "emulated-arm-bf16")
    prints = {k: variant_fingerprint(weights, "torch-bf16", k) for k in (amx, avx, none, capped, wide, arm)}
    assert len(set(prints.values())) == 6  # another kernel rounds otherwise: its vectors are not reused as equal
    assert variant_fingerprint(weights, "torch", amx) == weights  # fp32 torch agrees across kernels
    here = embed_backends.bf16_kernel()
    assert variant_fingerprint(weights, "torch-bf16") == variant_fingerprint(weights, "torch-bf16", here)


def test_an_unknown_backend_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match=r"embedding\.backend: 'tensorrt' is not one of"):
        variant_fingerprint("sha256:" + "ab" * 32, "tensorrt")
    with pytest.raises(ValueError, match=r"embedding\.backend: 'tensorrt'"):
        embed_backends.load_embedder("m", None, 32, "tensorrt")


def test_mean_pooling_ignores_padding_and_normalises():
    tokens = np.array([[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]], np.float32)
    got = embed_backends.mean_pool_normalize(tokens, np.array([1, 1, 0]))
    np.testing.assert_allclose(got, np.array([2.0, 2.0]) / np.sqrt(8.0), rtol=1e-6)
    assert got.dtype == np.float32


def test_the_packaged_model_truncates_at_256_tokens():
    assert models.max_seq_length(models.embedding_model_path(None)) == 256


def test_a_beir_index_is_cached_per_backend_and_torch_keeps_its_key(tmp_path, make_cfg):
    from sourcegate.pipelines.app.beir import dataset_config
    from sourcegate.pipelines.search.analyzer import ANALYZER_ID

    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "title": "t", "text": "x"}\n')
    run_id = {b: dataset_config(make_cfg(**{"embedding.backend": b}), tmp_path, tmp_path / "out")[1] for b in BACKENDS}
    assert len(set(run_id.values())) == len(BACKENDS)
    # the key as it was computed before the key existed: the config's dict without embedding.backend
    before_backends = make_cfg().model_dump()
    del before_backends["embedding"]["backend"]
    content = hashlib.sha256((tmp_path / "corpus.jsonl").read_bytes()).hexdigest()
    inputs = [content, before_backends["embedding"], before_backends["chunking"], ANALYZER_ID]
    assert run_id["torch"] == "beir-" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]
