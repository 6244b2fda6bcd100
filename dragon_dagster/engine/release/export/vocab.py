"""The tokenizer as GGUF metadata, the way llama.cpp's converter writes a byte-level BPE vocabulary (its
`_set_vocab_gpt2`): every token with its type, the merges, the special token ids, add_bos_token, the chat
template, and `tokenizer.ggml.pre`, the name of the pre-tokenizer (how text is split before the merges).

llama.cpp names the pre-tokenizer by hashing how the tokenizer encodes a fixed text; the hashes below are a
few of its table's (conversion/base.py, get_vocab_base_pre, llama.cpp as vendored in llama-cpp-python 0.3.36).
The hash covers the vocabulary too, so a known splitting rule over another vocabulary (a Qwen2 tokenizer class
over SmolLM2's vocabulary, say) hashes to something new; then the rule itself is read from tokenizer.json and
named when it is one llama.cpp implements (the regexes as transformers' GGUF loader rebuilds them, so a file
loads back splitting text the same way). Anything else is refused, as the converter refuses an unknown hash:
llama.cpp would split text differently from the tokenizer the model was trained with.
"""

from __future__ import annotations

import json
from hashlib import sha256
from pathlib import Path

from .errors import ExportError

# The converter's check text, verbatim.
CHECK_TEXT = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"  # noqa: E501 - llama.cpp's check text

PRE_TOKENIZERS = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # HuggingFaceTB/SmolLM-135M
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen/Qwen1.5-7B
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen/Qwen3-Embedding-0.6B
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # meta-llama/Meta-Llama-3-8B
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # openai-community/gpt2
}


# Split rules by llama.cpp name, in the order a rule shared by several names is named.
SPLIT_NAMES = ("qwen2", "llama-bpe", "gpt-4o", "tekken")


def split_rule_name(tokenizer) -> str | None:
    """The llama.cpp name of the tokenizer's splitting rule, read from its pre_tokenizer, or None."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    pre = json.loads(tokenizer.backend_tokenizer.to_str()).get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"  # GPT-2's own regex, inside ByteLevel
    parts = pre.get("pretokenizers") or []
    if (
        pre.get("type") != "Sequence"
        or len(parts) != 2
        or parts[0].get("type") != "Split"
        or parts[1].get("type") != "ByteLevel"
        or parts[1].get("use_regex")
    ):
        return None
    regex = (parts[0].get("pattern") or {}).get("Regex")
    return next((n for n in SPLIT_NAMES if GGUF_PRE_TOKENIZER_SPLITS.get(n) == regex), None)


def pre_tokenizer_name(tokenizer) -> str:
    digest = sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
    name = PRE_TOKENIZERS.get(digest) or split_rule_name(tokenizer)
    if name is None:
        raise ExportError(
            f"the tokenizer's pre-tokenizer is not one this export knows (llama.cpp check hash "
            f"{digest}; known: {', '.join(sorted(set(PRE_TOKENIZERS.values())))}): llama.cpp "
            "would split text differently from the tokenizer the model was trained with"
        )
    return name


def looks_special(token: str) -> bool:
    """The converter's does_token_look_special: some added tokens are control tokens not marked special."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<｜") and token.endswith("｜>"))
    )


def token_list(tokenizer, n_vocab: int) -> tuple[list[str], list[int]]:
    """(tokens, types) for ids 0..n_vocab-1, as the converter's get_vocab_base: added tokens are CONTROL when
    special (or looking special), else USER_DEFINED; ids the tokenizer lacks are [PAD<id>] UNUSED."""
    import gguf

    vocab = tokenizer.get_vocab()
    if max(vocab.values()) >= n_vocab:
        raise ExportError(f"the tokenizer has ids up to {max(vocab.values())} but the model's vocab_size is {n_vocab}")
    reverse = {i: t for t, i in vocab.items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added:
            if not decoder[i].normalized:  # llama.cpp expects added tokens pre-normalized
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            if decoder[i].special or looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    return tokens, types


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer puts BOS before plain text: tried, since tokenizer_config.json often does not say."""
    ids = tokenizer("a")["input_ids"]
    return tokenizer.bos_token_id is not None and bool(ids) and ids[0] == tokenizer.bos_token_id


def add_tokenizer(writer, model_dir: Path, n_vocab: int) -> int:
    """Write the tokenizer keys; returns the token count (the model's vocab_size)."""
    import gguf
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if not getattr(tokenizer, "is_fast", False) or tokenizer.backend_tokenizer.model.__class__.__name__ != "BPE":
        raise ExportError("only byte-level BPE tokenizers (tokenizer.json with a BPE model) are exported to GGUF")
    tokens, types = token_list(tokenizer, n_vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_name(tokenizer))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(str(model_dir), load_merges=True, n_vocab=len(tokens))
    if not special.merges:
        raise ExportError(f"{model_dir}/tokenizer.json has no BPE merges")
    if special.chat_template is None and getattr(tokenizer, "chat_template", None):
        special.chat_template = tokenizer.chat_template
    special.add_special_token.setdefault("bos", adds_bos(tokenizer))
    special.add_to_gguf(writer, quiet=True)
    return len(tokens)
