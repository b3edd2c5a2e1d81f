"""The row kernels' GPU golden cases (tests/gpu/test_golden.py), importable without torch so that the CPU suite
proves every one of their plans too (tests/prove/test_row_cases_prove.py): a plan the GPU test would build but
the field check refuses fails in CI, not only in the next GPU session."""

from __future__ import annotations

ROW_VARIANTS = {
    "warp-per-row": {"threads": "32", "rows": "4"},
    "warp-per-row-uncached": {"threads": "32", "rows": "1", "cache_row": "false"},
    "128": {"threads": "128"},
    "512": {"threads": "512"},
    "1024": {"threads": "1024"},
    "256-uncached": {"threads": "256", "cache_row": "false"},
    # a cluster of blocks shares each row, combining reductions through distributed shared memory
    "cluster2-512": {"threads": "512", "row_cluster": "2", "cache_row": "true"},
    "cluster4-256": {"threads": "256", "row_cluster": "4", "cache_row": "true"},
    "cluster8-128-uncached": {"threads": "128", "row_cluster": "8", "cache_row": "false"},
}


ROW_COLUMNS = (1000, 4096, 16384, 65536)
ROW_EXAMPLES = (("softmax.habu", "SOFTMAX-ROWS", "C"), ("rmsnorm.habu", "RMSNORM-ROWS", "D"))


def row_case_skip(variant: str, cols: int) -> str | None:
    """Why a (variant, columns) case is not built: a warp a row is for short rows; a block's part of a row
    must start on a 16-byte vector (the rules refuse it: "vector-align")."""
    if variant.startswith("warp-per-row") and cols > 4096:
        return "a warp per row is for short rows"
    share = int(ROW_VARIANTS[variant].get("row_cluster", "1"))
    if cols % (share * 8):
        return "vector-align"
    return None


PREFETCH_CASES = {
    "softmax-4096-512": ("softmax.habu", "SOFTMAX-ROWS", "C", 4096, {"threads": "512"}),  # one chunk a thread
    "softmax-16384-512": ("softmax.habu", "SOFTMAX-ROWS", "C", 16384, {"threads": "512"}),  # two blocks an SM
    "softmax-16384-1024": ("softmax.habu", "SOFTMAX-ROWS", "C", 16384, {"threads": "1024"}),
    "softmax-32768-default": ("softmax.habu", "SOFTMAX-ROWS", "C", 32768, {}),
    "rmsnorm-16384-256": ("rmsnorm.habu", "RMSNORM-ROWS", "D", 16384, {"threads": "256"}),
    "rmsnorm-65536-512": ("rmsnorm.habu", "RMSNORM-ROWS", "D", 65536, {"threads": "512"}),  # 16 chunks a thread
    # persistent clusters: each cluster walks rows, combining through distributed shared memory
    "softmax-65536-cluster2": ("softmax.habu", "SOFTMAX-ROWS", "C", 65536, {"threads": "512", "row_cluster": "2"}),
    "rmsnorm-65536-cluster4": ("rmsnorm.habu", "RMSNORM-ROWS", "D", 65536, {"threads": "512", "row_cluster": "4"}),
}
