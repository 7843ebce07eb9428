"""``colgraph info INDEX``: an index's counts and encoders (from its manifest) and the backends."""
from __future__ import annotations

import json
from pathlib import Path


def cmd_info(args) -> int:
    from .. import backends
    from ..kg.index import _read_manifest

    m = _read_manifest(Path(args.index))
    info = {"index": args.index, "generation": m["generation"], "documents": len(m["documents"]),
            "totals": m.get("totals"), "dims": m["dims"], "dtype": m["dtype"], "encoders": m["encoders"],
            "backends": {k: v for k, v in backends().items() if k in ("native", "igraph_version", "cpu_isa_float32",
                                                                    "triton_importable", "cuda")}}
    print(json.dumps(info, indent=1, default=str))
    return 0
