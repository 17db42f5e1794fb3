"""Tokenize on the fly: ``load_tokens(text_column=, tokenizer=)``.

A :class:`TextTokenizer` turns the text column of a decoded batch into what the token packer
takes from a token column, (offsets, int64 values), ``TOKENIZE_RECORDS`` records per tokenizer
call. It runs where the batch is read: in a DataLoader worker, or in the main process at 0
workers, and also in the reader's prefetch threads (a range's first batch is read, and so
tokenized, ahead), so a callable tokenizer may be called from more than one thread at once.

Resume stays exact because a state counts records and the token offset in the next record,
never tokens, and a deterministic tokenizer makes the same tokens again. The state names the
tokenizer (:attr:`TextTokenizer.name`), so a state made with another tokenizer is refused
rather than resumed at offsets into other tokens.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from syvain_training_data.loading.columns import python_columns

__all__ = [
    "MAX_TOKENIZER_NAME",
    "TOKENIZE_RECORDS",
    "TextTokenizer",
    "text_problem",
    "text_tokenizer",
    "tokenizer_refusal",
]

# Texts per tokenizer call: enough for encode_batch to spread over its threads, few enough
# that a worker's first batch does not wait for a whole decoded batch (8192 records).
TOKENIZE_RECORDS = 256
# A state holds the tokenizer's name; a loader state's strings are at most 64 characters.
MAX_TOKENIZER_NAME = 64
_INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class TextTokenizer:
    """Tokenizes ``column`` of decoded batches with ``tokenizer``: a ``tokenizers.Tokenizer``
    (``native``; encoded without its post-processor's special tokens) or a callable
    ``list[str] -> list[list[int]]``. ``name`` is what a loader state names it by. Picklable
    when the tokenizer is (a ``tokenizers.Tokenizer`` is), so spawned workers get a copy."""

    column: str
    tokenizer: Any
    name: str
    native: bool

    def encode(self, texts: list[str]) -> Any:
        """The tokenizer's answer for ``texts``: a list of token id lists when it is right."""
        if not self.native:
            return self.tokenizer(texts)
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets; either releases
        # the GIL while it encodes.
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return [encoding.ids for encoding in encode(texts, add_special_tokens=False)]

    def token_lists(
        self, batch: Any, uri: str, first: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(offsets, int64 values) of the tokens of ``batch``'s records, ``TOKENIZE_RECORDS``
        at a time, as a token column would give them. ``first`` numbers the batch's first
        record in shard ``uri``, for errors: a record whose text is missing or not a str, a
        tokenizer answer that is not a list of int lists, one per text, or an id beyond int64
        are ValueErrors naming the shard and the record."""
        texts = _texts(batch, self.column, uri, first)
        for low in range(0, len(texts), TOKENIZE_RECORDS):
            chunk = texts[low : low + TOKENIZE_RECORDS]
            yield self._flat(chunk, self.encode(chunk), uri, first + low)

    def tokens_of(
        self, texts: list[str], where: Sequence[tuple[str, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(offsets, int64 values) of the tokens of ``texts``, records that need not follow
        one another in one shard (a filtered token loader's): ``where`` holds each one's
        (shard URI, record number). An error names the record it is about: on a wrong answer
        for the texts together, each is tokenized alone to find it."""
        uri, first = where[0]
        try:
            return self._flat(texts, self.encode(texts), uri, first)
        except ValueError as error:
            for text, (uri, number) in zip(texts, where, strict=True):
                self._flat([text], self.encode([text]), uri, number)
            raise error

    def _flat(
        self, texts: list[str], lists: Any, uri: str, first: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.native:  # a tokenizers.Tokenizer's answer is u32 lists by construction
            _check_lists(lists, len(texts), uri, first)
        lengths = numpy.fromiter(map(len, lists), dtype=numpy.int64, count=len(lists))
        offsets = numpy.zeros(len(lists) + 1, dtype=numpy.int64)
        numpy.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        flat = itertools.chain.from_iterable(lists)
        try:
            values = numpy.fromiter(flat, dtype=numpy.int64, count=total)
        except OverflowError:
            raise _beyond_int64(lists, uri, first) from None
        return torch.from_numpy(offsets), torch.from_numpy(values)


def _texts(batch: Any, column: str, uri: str, first: int) -> list[str]:
    """``column`` of ``batch`` as a list of str; a ValueError names the first record whose
    text is missing (a null or no such key) or not a str."""
    names = batch.column_names if hasattr(batch, "column_names") else batch.schema.names
    if column not in names:  # no record of the batch has it
        texts: list[Any] = [None] * batch.num_rows
    else:
        texts = python_columns(batch, [column])[column]
    if set(map(type, texts)) <= {str}:
        return texts
    k, text = next((k, t) for k, t in enumerate(texts) if type(t) is not str)
    raise _not_text(text, column, uri, first + k)


def _not_text(text: object, column: str, uri: str, record: int) -> ValueError:
    if text is None:
        return ValueError(f"Record {record} of shard {uri} has no text column {column!r}")
    return ValueError(
        f"Record {record} of shard {uri} holds {type(text).__name__} in text column "
        f"{column!r}, not a str"
    )


def text_problem(
    records: Iterable[Mapping[str, Any]], column: str, uri: str, first: int
) -> ValueError | None:
    """The error for the first of ``records`` (record ``first`` of shard ``uri`` on) whose
    ``column`` is missing or not a str, if any: what a columnar decoder that refused a column
    mixing kinds of values could not name."""
    for k, record in enumerate(records):
        text = record.get(column)
        if type(text) is not str:
            return _not_text(text, column, uri, first + k)
    return None


def _check_lists(lists: Any, count: int, uri: str, first: int) -> None:
    """A callable's answer for ``count`` texts: a list (or tuple) of ``count`` lists (or
    tuples) of ints (not bools), else a ValueError naming the first record it is wrong for."""
    if not isinstance(lists, list | tuple) or len(lists) != count:
        size = f" of {len(lists)} items" if isinstance(lists, list | tuple) else ""
        # A transformers tokenizer answers a BatchEncoding, a mapping with input_ids.
        hint = " (a transformers tokenizer: pass its backend_tokenizer)"
        raise ValueError(
            f"The tokenizer returned {type(lists).__name__}{size} for the {count} texts of "
            f"records {first} to {first + count - 1} of shard {uri}; it must return a list of "
            f"int token id lists, one per text{hint if isinstance(lists, Mapping) else ''}"
        )
    if not set(map(type, lists)) <= {list, tuple}:
        k = next(k for k, ids in enumerate(lists) if type(ids) not in (list, tuple))
        raise ValueError(
            f"The tokenizer returned {type(lists[k]).__name__} for record {first + k} of "
            f"shard {uri}; it must return a list of int token ids per text"
        )
    kinds = set(map(type, itertools.chain.from_iterable(lists)))
    if all(issubclass(kind, int) and kind is not bool for kind in kinds):
        return
    for k, ids in enumerate(lists):
        for item in ids:
            if isinstance(item, bool) or not isinstance(item, int):
                raise ValueError(
                    f"The tokenizer returned {type(item).__name__} {item!r:.40} among the token "
                    f"ids of record {first + k} of shard {uri}; token ids are ints"
                )


def _beyond_int64(lists: Sequence[Sequence[int]], uri: str, first: int) -> ValueError:
    low, high = _INT64
    for k, ids in enumerate(lists):
        for item in ids:
            if not low <= item <= high:
                shown = item if item.bit_length() <= 128 else f"an int of {item.bit_length()} bits"
                return ValueError(
                    f"The tokenizer returned token id {shown} for record {first + k} of shard "
                    f"{uri}, which does not fit int64"
                )
    return ValueError(f"The tokenizer returned a token id that does not fit int64 in shard {uri}")


def _tokenizers_class() -> Any:
    """``tokenizers.Tokenizer`` when the package is imported (a caller holding one has), else
    None: the base install does not need ``tokenizers``."""
    module = sys.modules.get("tokenizers")
    found = getattr(module, "Tokenizer", None)
    return found if isinstance(found, type) else None


def text_tokenizer(
    text_column: object, tokenizer: object, tokenizer_name: object, column: object
) -> TextTokenizer | None:
    """``load_tokens``' tokenizing arguments, checked at the call: None when it reads token
    ids from ``column`` instead. ``text_column`` and ``tokenizer`` go together, and not with
    ``column``; a callable needs ``tokenizer_name`` (its identity in a loader state), a
    ``tokenizers.Tokenizer`` takes none (it is named by the sha256 of its ``to_str()``)."""
    if text_column is None and tokenizer is None:
        if tokenizer_name is not None:
            raise ValueError("tokenizer_name names a tokenizer: pass it with tokenizer=")
        return None
    if tokenizer is None:
        raise ValueError("text_column needs tokenizer, the tokenizer of its text")
    if text_column is None:
        raise ValueError(
            "tokenizer needs text_column, the column of text it tokenizes (column= names a "
            "column of token ids, read as they are)"
        )
    if not isinstance(text_column, str) or not text_column:
        raise TypeError(f"text_column must be a column name (a str), not {text_column!r:.40}")
    if column is not None:
        raise ValueError(
            "column and text_column are alternatives: column reads token ids as they are, "
            "text_column tokenizes text"
        )
    native = _tokenizers_class()
    if native is not None and isinstance(tokenizer, native):
        if tokenizer_name is not None:
            raise ValueError(
                "tokenizer_name is for a callable tokenizer; a tokenizers.Tokenizer is named by "
                "the sha256 of its serialized form (to_str())"
            )
        digest = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
        return TextTokenizer(text_column, tokenizer, f"sha256:{digest[:32]}", True)
    if not callable(tokenizer):
        raise TypeError(
            "tokenizer must be a tokenizers.Tokenizer or a callable list[str] -> list[list[int]], "
            f"not {type(tokenizer).__name__}"
        )
    return TextTokenizer(text_column, tokenizer, _callable_name(tokenizer_name), False)


def _callable_name(name: object) -> str:
    if name is None:
        raise ValueError(
            "A callable tokenizer needs tokenizer_name, which a loader state keeps so that it "
            "resumes only with that tokenizer (e.g. 'tiktoken cl100k_base'; change it when the "
            "tokenizer changes)"
        )
    if not isinstance(name, str) or not 0 < len(name) <= MAX_TOKENIZER_NAME:
        raise TypeError(
            f"tokenizer_name must be a str of 1 to {MAX_TOKENIZER_NAME} characters, not "
            f"{name!r:.80}"
        )
    return name


def tokenizer_refusal(theirs: str | None, ours: TextTokenizer | None) -> str:
    """Why a state made with tokenizer ``theirs`` (None: read from a token column) does not
    resume a loader tokenizing with ``ours`` (None: reading a token column)."""
    if ours is None:
        return (
            f"This loader state was made with tokenizer {theirs!r} (text_column=, tokenizer=), "
            "and this loader reads token ids from a column: pass that tokenizer to resume it"
        )
    if theirs is None:
        return (
            "This loader state was made by a loader reading token ids from a column, and this "
            f"loader tokenizes text with tokenizer {ours.name!r}"
        )
    return (
        f"This loader state was made with tokenizer {theirs!r}, and this loader tokenizes with "
        f"tokenizer {ours.name!r}: its token offsets would point into other tokens (resume "
        "with the tokenizer that made it)"
    )
