"""A BERT encoder's forward pass in plain torch, and its tokenizer through `tokenizers` alone.

Importing `transformers` and its BERT module costs a cold `sourcegate query` (and every night task that embeds)
about three seconds (docs/benchmarks/26-serve.md) for a forward pass this module holds in about fifty lines. The ops are
transformers' BertModel's (5.x, `sdpa` attention, eval mode), called in its order on the same dtypes, so the hidden
states are the same to the bit (tests/test_embed_backends.py compares them, under bf16 autocast too). A folder
this module does not read exactly (another architecture or activation, no safetensors or tokenizer.json) is None
from `load`, and its caller loads it with `transformers`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - torch's own name for it


def readable(folder: Path) -> dict | None:
    """The folder's config when it is a plain BERT encoder this module computes exactly, else None."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    plain = (
        config.get("model_type") == "bert"
        and config.get("architectures") in (None, ["BertModel"])
        and config.get("hidden_act") == "gelu"
        and config.get("position_embedding_type", "absolute") == "absolute"
        and not config.get("is_decoder")
    )
    files = all((folder / name).is_file() for name in ("model.safetensors", "tokenizer.json"))
    return config if plain and files else None


class _Attention(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.self = nn.Module()
        self.self.query, self.self.key, self.self.value = (nn.Linear(size, size) for _ in range(3))
        self.output = _Output(size, size)


class _Output(nn.Module):
    def __init__(self, size_in: int, size: int):
        super().__init__()
        self.dense = nn.Linear(size_in, size)
        self.LayerNorm = nn.LayerNorm(size)  # noqa: N815 - the checkpoint's name


class _Layer(nn.Module):
    def __init__(self, size: int, intermediate: int):
        super().__init__()
        self.attention = _Attention(size)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(size, intermediate)
        self.output = _Output(intermediate, size)


class Bert(nn.Module):
    """BertModel's encoder without its pooler (its output is never read here): `forward` -> the last hidden state."""

    def __init__(self, config: dict):
        super().__init__()
        size, eps = config["hidden_size"], config["layer_norm_eps"]
        self.heads = config["num_attention_heads"]
        self.head_size = size // self.heads
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(config["vocab_size"], size, padding_idx=config["pad_token_id"])
        self.embeddings.position_embeddings = nn.Embedding(config["max_position_embeddings"], size)
        self.embeddings.token_type_embeddings = nn.Embedding(config["type_vocab_size"], size)
        self.embeddings.LayerNorm = nn.LayerNorm(size)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(
            _Layer(size, config["intermediate_size"]) for _ in range(config["num_hidden_layers"])
        )
        for norm in (m for m in self.modules() if isinstance(m, nn.LayerNorm)):
            norm.eps = eps
        self.register_buffer("position_ids", torch.arange(config["max_position_embeddings"])[None], persistent=False)

    def forward(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        batch, length = input_ids.shape
        e = self.embeddings
        x = e.word_embeddings(input_ids) + e.token_type_embeddings(token_type_ids)
        x = e.LayerNorm(x + e.position_embeddings(self.position_ids[:, :length]))
        # transformers' sdpa mask: none without padding, else every query row may read the unpadded keys
        mask = None if attention_mask.all() else attention_mask.bool()[:, None, None, :].expand(-1, 1, length, -1)
        mask = mask if mask is None else mask.contiguous()  # materialised, as transformers passes it
        for layer in self.encoder.layer:
            a = layer.attention.self
            q, k, v = (p(x).view(batch, length, -1, self.head_size).transpose(1, 2) for p in (a.query, a.key, a.value))
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=self.head_size**-0.5)
            o = o.transpose(1, 2).contiguous().reshape(batch, length, -1).contiguous()
            x = layer.attention.output.LayerNorm(layer.attention.output.dense(o) + x)
            h = F.gelu(layer.intermediate.dense(x))
            x = layer.output.LayerNorm(layer.output.dense(h) + x)
        return x


class Encoder:
    """A plain BERT folder's model (eval mode) and tokenizer, as the bf16 embedder asks them: token ids, padded
    batches, hidden states. The tokenizer's truncation and padding are set on every call (not thread-safe, as
    transformers' fast tokenizer is not)."""

    CODE = (Bert,)  # what computes a vector here, for the bindings of kept vectors

    def __init__(self, folder: Path, config: dict):
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        self.model = Bert(config)
        weights = {k.removeprefix("bert."): v for k, v in load_file(str(folder / "model.safetensors")).items()}
        unused = [k for k in weights if k.startswith("pooler.") or k.endswith("position_ids")]  # a buffer here
        self.model.load_state_dict({k: v for k, v in weights.items() if k not in unused}, strict=True)
        self.model.eval()
        self.hidden_size = config["hidden_size"]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.pad = {"pad_id": config["pad_token_id"], "pad_token": self.tokenizer.id_to_token(config["pad_token_id"])}

    def token_ids(self, texts: list[str], max_length: int) -> list[list[int]]:
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.no_padding()
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def padded(self, texts: list[str], length: int) -> dict[str, torch.Tensor]:
        self.tokenizer.enable_truncation(length)
        self.tokenizer.enable_padding(length=length, pad_type_id=0, **self.pad)
        encoded = self.tokenizer.encode_batch(texts)
        return {
            "input_ids": torch.tensor([e.ids for e in encoded]),
            "attention_mask": torch.tensor([e.attention_mask for e in encoded]),
            "token_type_ids": torch.tensor([e.type_ids for e in encoded]),
        }

    def hidden(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])


def load(folder: Path) -> Encoder | None:
    """The Encoder of a plain BERT folder (`readable`); None otherwise."""
    config = readable(folder)
    return None if config is None else Encoder(folder, config)
