"""Make DGL 2.1.0's CPU wheel importable on a torch it was not built for (the GPU machine's).

Its graphbolt library exists only for torch 2.2.x, and `import dgl` loads it through
dgl.distributed; gnnssd uses neither graphbolt nor dgl.distributed, so the three imports
are made optional. Run on the installed copy: python device_patch_dgl.py SITE_PACKAGES.
"""
from __future__ import annotations

import sys
from pathlib import Path

IMPORT = "graphbolt as gb"
OPTIONAL = ("\ntry:\n    from .. import graphbolt as gb\nexcept (ImportError, OSError):  # no library for this torch\n"
            "    gb = None\n")


def patch(site: Path) -> list[str]:
    patched = []
    for name in ("graph_services.py", "partition.py", "dist_graph.py"):
        path = site / "dgl" / "distributed" / name
        lines = path.read_text().splitlines(keepends=True)
        for i, line in enumerate(lines):
            if line.startswith("from .. import") and IMPORT in line:
                lines[i] = line.replace(", " + IMPORT, "") + OPTIONAL
                path.write_text("".join(lines))
                patched.append(path.name)
                break
    return patched


if __name__ == "__main__":
    print("patched:", patch(Path(sys.argv[1])))
