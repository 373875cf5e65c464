"""The tensor layout (fleet: tensor parallel x sharding x data parallel, no pipeline): its
strategy (`FleetStrategy`), its axis (`TensorAxis`), its checkpoints (`weights`) and the
resharding of saved slices between degrees (`reshard`)."""
from .axis import TensorAxis
from .strategy import FleetStrategy

__all__ = ["FleetStrategy", "TensorAxis"]
