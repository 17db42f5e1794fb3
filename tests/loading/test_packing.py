"""The packers of `load_tokens` (`loading/packing.py`), without I/O: blocks and rows, the
position after each batch, and the channels aligned with the tokens (document positions, loss
mask), checked against a per-token model."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from syvain_training_data.loading.documents import cu_seqlens  # noqa: E402
from syvain_training_data.loading.packing import (  # noqa: E402
    Cut,
    Records,
    RowPacker,
    TokenChannels,
    TokenPacker,
    pack_records,
    pack_run,
)

BOTH = TokenChannels(documents=True, loss_mask=True)


def test_packer_positions_follow_the_tokens():
    packer = TokenPacker(seq_len=3, batch_size=2)
    out = list(packer.add(0, 0, torch.arange(4), [4]))
    assert out == []
    ((batch, whole, offset),) = packer.add(1, 2, torch.arange(10, 14), [4])
    assert batch.tolist() == [[0, 1, 2], [3, 10, 11]] and (whole, offset) == (1, 4)
    assert list(packer.add(2, 0, torch.tensor([20]), [1])) == []
    ((last, whole, offset),) = packer.finish(drop_last=False)
    assert last.tolist() == [[12, 13, 20]] and (whole, offset) == (3, 0)
    assert list(TokenPacker(3, 2).finish(drop_last=False)) == []
    dropped = TokenPacker(3, 2)
    assert list(dropped.add(0, 0, torch.arange(5), [5])) == []
    assert list(dropped.finish(drop_last=True)) == []


def records_of(lengths: list[int], rng: random.Random) -> Records:
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    values = torch.arange(100, 100 + bounds[-1])
    mask = torch.tensor([rng.random() < 0.5 for _ in range(bounds[-1])], dtype=torch.bool)
    return Records(values, bounds, mask)


def model(lengths, records: Records, eos_id, cut_at=None):
    """Per token of the stream a packer sees: (token, position in its document, mask)."""
    stream = []
    for k, (low, high) in enumerate(zip(records.bounds, records.bounds[1:], strict=False)):
        items = [(int(records.values[i]), i - low, bool(records.mask[i])) for i in range(low, high)]
        if eos_id is not None:
            items.append((eos_id, high - low, True))
        start = (cut_at or {}).get(k, 0)
        stream += items[start:]
    return stream


def random_case(seed, choices, most_records, most_seq_len, most_batch):
    """(rng, record lengths, records, seq_len, batch size) drawn from ``seed``: up to
    ``most_records`` records of lengths among ``choices``."""
    rng = random.Random(seed)
    lengths = [rng.choice(choices) for _ in range(rng.randint(1, most_records))]
    records = records_of(lengths, rng)
    return rng, lengths, records, rng.randint(1, most_seq_len), rng.randint(1, most_batch)


def flat(batches, key):
    return [v for b, _, _ in batches for row in b[key].tolist() for v in row]


@pytest.mark.parametrize("eos_id", [None, 7])
@pytest.mark.parametrize("seed", range(8))
def test_a_run_packs_as_its_records_one_by_one(seed, eos_id):
    # A decoded batch goes to the packer as one run; the batches, their channels and the
    # position after each must be those of its records added one at a time (empty records,
    # eos and cut records included), and the channels those of the per-token model.
    rng, lengths, records, seq_len, batch = random_case(seed, [0, 1, 2, 5, 9], 30, 4, 3)
    bounds = records.bounds
    no_cut = Cut({}, 0, [(0, len(lengths))])

    def packed(pieces):
        return [(dict(b), whole, offset) for b, whole, offset in pieces]

    one_run, one_by_one = (
        TokenPacker(seq_len, batch, None, BOTH),
        TokenPacker(seq_len, batch, None, BOTH),
    )
    split = rng.randint(1, len(lengths))  # two runs: the first ends where a record does
    first, second = (
        Records(records.values, bounds[: split + 1], records.mask),
        Records(records.values, bounds[split:], records.mask),
    )
    runs = packed(pack_run(one_run, 3, first, eos_id))
    runs += packed(pack_run(one_run, 3 + split, second, eos_id))
    runs += packed(one_run.finish(drop_last=False))
    by_record = packed(pack_records(one_by_one, 3, records, eos_id, no_cut))
    by_record += packed(one_by_one.finish(drop_last=False))
    key = [(b["tokens"].tolist(), w, o) for b, w, o in runs]
    assert key == [(b["tokens"].tolist(), w, o) for b, w, o in by_record]
    for name in ("positions", "loss_mask"):
        assert flat(runs, name) == flat(by_record, name)
    expected = model(lengths, records, eos_id)
    kept = len(expected) // seq_len * seq_len
    assert (
        list(
            zip(flat(runs, "tokens"), flat(runs, "positions"), flat(runs, "loss_mask"), strict=True)
        )
        == (expected[:kept])
    )
    for b, _, _ in runs:
        assert b["positions"].dtype == torch.int64 and b["loss_mask"].dtype == torch.bool


@pytest.mark.parametrize("eos_id", [None, 7])
@pytest.mark.parametrize("seed", range(8))
def test_a_cut_record_keeps_counting_its_positions(seed, eos_id):
    # A resumed record starts at its cut token: its first position is the cut, not 0.
    rng = random.Random(seed)
    lengths = [rng.choice([1, 2, 5, 9]) for _ in range(rng.randint(2, 12))]
    records = records_of(lengths, rng)
    cut_at = {
        k: rng.randint(1, n - 1 + (eos_id is not None))
        for k, n in enumerate(lengths)
        if rng.random() < 0.5 and n - 1 + (eos_id is not None) >= 1
    }
    packer = TokenPacker(2, 1, None, BOTH)
    out = list(pack_records(packer, 0, records, eos_id, Cut(cut_at, 0, [(0, len(lengths))])))
    out += list(packer.finish(drop_last=False))
    expected = model(lengths, records, eos_id, cut_at)
    got = list(
        zip(flat(out, "tokens"), flat(out, "positions"), flat(out, "loss_mask"), strict=True)
    )
    assert got == expected[: len(expected) // 2 * 2]


@pytest.mark.parametrize("eos_id", [None, 5])
@pytest.mark.parametrize("seed", range(6))
def test_rows_hold_one_record_each_padded_or_truncated(seed, eos_id):
    rng, lengths, records, seq_len, batch = random_case(seed, [0, 1, 3, 6, 11], 20, 8, 4)
    channels = TokenChannels(documents=True, loss_mask=True, rows=True)
    packer = RowPacker(seq_len, batch, -1, eos_id, None, channels)
    split = rng.randint(1, len(lengths))
    out = list(packer.pack(0, Records(records.values, records.bounds[: split + 1], records.mask)))
    out += list(packer.pack(split, Records(records.values, records.bounds[split:], records.mask)))
    out += list(packer.finish(False))
    rows = [(r, b) for b, _, _ in out for r in range(len(b["tokens"]))]
    assert len(rows) == len(lengths)
    done = 0
    for b, whole, offset in out:
        done += len(b["tokens"])
        assert (whole, offset) == (done, 0)
        assert len(b["tokens"]) == (
            batch if done < len(lengths) or len(lengths) % batch == 0 else len(lengths) % batch
        )
    per_record = model(lengths, records, eos_id)
    at = 0
    for k, (r, b) in enumerate(rows):
        whole = lengths[k] + (eos_id is not None)
        items, at = per_record[at : at + whole], at + whole
        kept = items[:seq_len]
        pad = seq_len - len(kept)
        assert b["tokens"][r].tolist() == [t for t, _, _ in kept] + [-1] * pad
        assert b["loss_mask"][r].tolist() == [m for _, _, m in kept] + [False] * pad
        assert b["positions"][r].tolist() == list(range(seq_len))
        assert int(b["lengths"][r]) == len(kept)


def test_rows_drop_the_last_smaller_batch_with_drop_last():
    records = Records(torch.arange(10), [0, 2, 4, 6, 8, 10], None)
    packer = RowPacker(4, 2, 0, None, None, TokenChannels(rows=True))
    out = list(packer.pack(0, records))
    assert [w for _, w, _ in out] == [2, 4]
    assert list(packer.finish(True)) == []
    packer = RowPacker(4, 2, 0, None, None, TokenChannels(rows=True))
    list(packer.pack(0, records))
    ((last, whole, _),) = packer.finish(False)
    assert last["tokens"].tolist() == [[8, 9, 0, 0]] and last["lengths"].tolist() == [2]
    assert whole == 5


def test_cu_seqlens_split_rows_at_documents_and_row_starts():
    positions = torch.tensor([[3, 4, 0, 1, 2, 0], [0, 1, 2, 3, 0, 1]])
    bounds, longest = cu_seqlens(positions)
    assert bounds.dtype == torch.int32
    assert bounds.tolist() == [0, 2, 5, 6, 10, 12]
    assert longest == 4
    with pytest.raises(ValueError, match="positions must be"):
        cu_seqlens(torch.zeros(3))
