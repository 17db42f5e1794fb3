"""Where ``SplitDataLoader`` used to live; the loader is now the :mod:`loading` package."""

from syvain_training_data.loading.dataloader import SyvainDataLoader
from syvain_training_data.loading.dataset import ShardDataset
from syvain_training_data.loading.split_loader import SplitDataLoader

__all__ = ["ShardDataset", "SplitDataLoader", "SyvainDataLoader"]
