"""Tiny random encoders of each family (float64, eager attention) and a tiny WordPiece folder,
shared by the encoder tests and the command-line tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", ".", ","]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
VOCAB = SPECIAL + WORDS


def tiny_hf(family: str, *, seed: int = 0) -> Any:
    """A ``transformers`` BertModel / RobertaModel / DistilBertModel / ElectraModel of random weights, float64,
    eager attention (it returns the weights), in eval mode; its query and key weights scaled
    up so that the heads attend sharply (initialised at std 0.02 they are nearly uniform)."""
    model = _tiny_hf(family, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "key.weight", "q_lin.weight", "k_lin.weight")):
                p.mul_(40.0)
    return model


def _tiny_hf(family: str, seed: int) -> Any:
    import transformers as t

    torch.manual_seed(seed)
    common: dict[str, Any] = {"vocab_size": 40, "attn_implementation": "eager"}
    if family == "distilbert":
        cfg = t.DistilBertConfig(dim=16, n_layers=2, n_heads=4, hidden_dim=24,
                                 max_position_embeddings=16, **common)  # fmt: skip
        return t.DistilBertModel(cfg).double().eval()
    sizes = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24)
    if family == "electra":
        cfg = t.ElectraConfig(embedding_size=8, max_position_embeddings=16, **sizes, **common)
        return t.ElectraModel(cfg).double().eval()
    if family == "roberta":
        cfg = t.RobertaConfig(max_position_embeddings=18, type_vocab_size=1, **sizes, **common)
        return t.RobertaModel(cfg).double().eval()
    cfg = t.BertConfig(max_position_embeddings=16, **sizes, **common)
    return t.BertModel(cfg).double().eval()


def padded_batch(pad_id: int, *, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 7 tokens, the second padded after 4: ``(input_ids, attention_mask)``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 40, (2, 7), generator=g)
    ids[ids == pad_id] = 5
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0
    ids[1, 4:] = pad_id
    return ids, mask


def tokenizer_files(folder: Path) -> None:
    """A WordPiece ``tokenizer.json`` (``[CLS] … [SEP]``) over :data:`VOCAB`, lower-cased as
    BERT's, and its ``tokenizer_config.json``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    tok.add_special_tokens(SPECIAL)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
              "sep_token": "[SEP]", "tokenizer_class": "BertTokenizer"}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def tiny_bert_folder(folder: Path) -> Path:
    """A Hugging Face BERT folder of random float32 weights (written by attnlab's ``save_hf``,
    without importing ``transformers``) with a tokenizer over :data:`VOCAB`."""
    from attnlab import Encoder, EncoderConfig

    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=len(VOCAB), n_positions=16, d_model=16, n_layer=2,
                           n_head=4, d_ff=24)  # fmt: skip
    Encoder(config).save_hf(folder)
    tokenizer_files(folder)
    return folder
