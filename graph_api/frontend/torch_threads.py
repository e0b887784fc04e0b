"""Thread policy for graph_api partitions running beside PyTorch (placeholder)."""


def apply() -> None:
    return None
