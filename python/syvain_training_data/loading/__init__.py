"""Loading a split into PyTorch (SPEC section 6).

- :mod:`.plan`: the epoch plan, pure functions of record counts, seed, epoch and topology (no
  torch, no I/O), reusable by any engine.
- :mod:`.reader`: reads one consumer's record ranges of shards, in plan order.
- :mod:`.dataset`: the torch IterableDataset; :mod:`.dataloader`: the DataLoader with resume
  state; :mod:`.split_loader`: ``SplitDataLoader``, which builds them from a manifest.
- :mod:`.state`: the checks and bounds every field of a resume state passes (no torch).
"""
