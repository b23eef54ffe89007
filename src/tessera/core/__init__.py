"""The pure scheduling core: cluster state, requests, placement policies, fragmentation, invariants."""
