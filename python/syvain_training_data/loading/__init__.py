"""Loading a split into PyTorch (SPEC section 6).

The plan, pure functions of record counts, seed, epoch and topology (no torch, no I/O):
- :mod:`.plan`: read plans (what a loader reads, in which order), orders, topologies, levels
  and interrupts;
  :mod:`.block_order` (the seeded block shuffle), :mod:`.mixing` (stages mixed by weight) and
  :mod:`.schedule` (weights that change along the epoch);
- :mod:`.record_plan` and :mod:`.token_plan`: who reads what in a run after earlier runs of the
  epoch stopped, for record and token passes;
- :mod:`.state`: the checks and bounds every field of a resume state passes;
  :mod:`.token_state`: a token loader's state as JSON.

Reading and loading:
- :mod:`.selection`: the shards a split or its stages select; :mod:`.shard_indexes`: record
  offset indexes; :mod:`.reader`: one consumer's record ranges, in plan order;
- :mod:`.dataset` and :mod:`.dataloader`: the torch IterableDataset and DataLoader of ``load``;
  :mod:`.columns` (``columns=``), :mod:`.tokens` and :mod:`.packing` (``load_tokens``),
  :mod:`.list_columns` (list-of-ints columns as tensors, for both), :mod:`.documents`
  (``cu_seqlens``); :mod:`.positions`: loaders whose batches carry their workers' positions
  (``load_tokens``, and ``load(filter=)`` of :mod:`.filters`), and their states;
- :mod:`.split_loader`: ``SplitDataLoader``, which builds them from a manifest, its arguments
  checked by :mod:`.arguments`;
- :mod:`.transfer` and :mod:`.bundles`: how worker batches reach the training process;
  :mod:`.stats`: counters.
"""
