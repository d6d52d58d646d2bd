"""The registry of producers and consumers (``PawnQueue.registry``): its entries and the
processes that run them. Kept by :mod:`pawn_queue._protocol.registry`."""

from pawn_queue._protocol.registry import Instance, Liveness, Registry, RegistryEntry

__all__ = ["Instance", "Liveness", "Registry", "RegistryEntry"]

for _public in (Instance, Liveness, Registry, RegistryEntry):
    _public.__module__ = __name__
