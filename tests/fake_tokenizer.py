"""A byte-level tokenizer for unit tests: token i < 256 is byte i; 256 is EOS."""

from __future__ import annotations


class ByteTokenizer:
    eos_token_id = 256
    chat_template = None

    def __len__(self) -> int:
        return 257

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": list(text.encode("utf-8"))}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")
