"""Code shape figures for the restructuring notes: lines per library, the longest functions, and the
import edges between asr's packages (and whether horovod_ext imports asr).

    .venv/bin/python scripts/code_metrics.py [ROOT]        # ROOT: a checkout (default: this one)
    git worktree add /tmp/before 432c62a && .venv/bin/python scripts/code_metrics.py /tmp/before
"""
from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    files = [p for d in ("horovod_ext", "asr") for p in sorted((root / d).rglob("*.py"))]
    lines = collections.Counter()
    funcs, edges = [], collections.defaultdict(set)
    for p in files:
        rel = p.relative_to(root)
        lines[rel.parts[0]] += len(p.read_text().splitlines())
        module = ".".join(rel.with_suffix("").parts)
        pkg_parts = module.split(".")[:-1] if p.name != "__init__.py" else module.split(".")[:-1]
        tree = ast.parse(p.read_text())
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.append((n.end_lineno - n.lineno + 1, f"{module}.{n.name}"))
            elif isinstance(n, ast.ImportFrom) and n.level:
                base = pkg_parts[:len(pkg_parts) - (n.level - 1)]
                target = ".".join(base + ([n.module] if n.module else []))
                edges[package_of(module)].add(package_of(target))
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if a.name.split(".")[0] in ("asr", "horovod_ext"):
                        edges[package_of(module)].add(package_of(a.name))
    print("lines: " + ", ".join(f"{k} {v}" for k, v in sorted(lines.items())) + f" ({len(files)} files)")
    print("longest functions: " + "; ".join(f"{name} {n}" for n, name in sorted(funcs, reverse=True)[:6]))
    print("horovod_ext imports asr:", any(t.startswith("asr") for s, ts in edges.items()
                                         if s.startswith("horovod_ext") for t in ts))
    for src in ("asr.frontend", "asr.augment", "asr.data", "asr.models"):
        print(f"{src} imports: {sorted(t for t in edges.get(src, ()) if t != src)}")


if __name__ == "__main__":
    main()
