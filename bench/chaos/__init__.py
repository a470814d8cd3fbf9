"""The chaos soak (`python -m bench.chaos`): every service kind under load and faults, and the ledger."""
