#!/usr/bin/env python3
"""The Python packages of launch/ (pslaunch, psstudy_lib) and experiments/
(expkit) import as packages, and no module imports itself back.

- every module imports on its own in a fresh interpreter that has only the two
  import roots, launch/ and experiments/, on PYTHONPATH (no sys.path edits to
  lean on, no module imported before it by another test);
- the graph of their import statements (every one, at the top or inside a
  function; relative ones resolved) has no circle: no module imports a module
  that, directly or through others, imports it back. A circle hidden by a
  function-level import counts as one.
Standard library only; no binaries needed."""
import ast
import os
import subprocess
import sys
import tempfile
import unittest

import unittest_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
ROOTS = {"launch": ("pslaunch", "psstudy_lib"), "experiments": ("expkit",)}


def modules():
    """{dotted module name: its file} for every module of the packages."""
    found = {}
    for root, packages in ROOTS.items():
        for pkg in packages:
            d = os.path.join(REPO, root, pkg)
            for f in sorted(os.listdir(d)):
                if f.endswith(".py"):
                    name = pkg if f == "__init__.py" else pkg + "." + f[:-3]
                    found[name] = os.path.join(d, f)
    return found


def imported(name, path, known):
    """The modules of `known` that the file of module `name` imports."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = set()
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            # `from pkg import mod` imports pkg.mod; `from mod import name`, mod.
            targets = [base + "." + a.name for a in node.names] + [base]
        else:
            continue
        for t in targets:
            # The longest known prefix: `import pslaunch.netns` is pslaunch.netns.
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def circles(graph):
    """One circle [a, b, ..., a] per strongly connected group of modules
    (Tarjan), through the group's first module, in sorted order."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_shortest_circle(graph, g[0], set(g)) for g in sorted(groups)]


def _shortest_circle(graph, start, group):
    """[start, ..., start]: the shortest way round within `group` (breadth first)."""
    prev, frontier = {start: None}, [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w not in prev:
                    prev[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError("%s is in no circle" % start)


class ImportCyclesTest(unittest.TestCase):
    def test_every_module_imports_in_a_fresh_interpreter(self):
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=os.pathsep.join(os.path.join(REPO, r) for r in ROOTS))
        failed = []
        with tempfile.TemporaryDirectory() as cwd:  # nothing importable from the cwd
            for name in modules():
                r = subprocess.run([sys.executable, "-c", "import " + name], cwd=cwd, env=env,
                                   capture_output=True, text=True, timeout=60)
                if r.returncode != 0:
                    failed.append("%s: %s" % (name, (r.stderr.strip().splitlines() or ["?"])[-1]))
        self.assertEqual(failed, [])
        unittest_main.note("launch.import_cycles: %d modules each imported in a fresh interpreter"
                           % len(modules()))

    def test_no_module_imports_itself_back(self):
        known = modules()
        graph = {name: imported(name, path, known) for name, path in known.items()}
        self.assertEqual([" -> ".join(c) for c in circles(graph)], [])
        unittest_main.note("launch.import_cycles: %d import edges among %d modules, no circle"
                           % (sum(len(e) for e in graph.values()), len(graph)))

    def test_a_circle_is_found(self):
        # The detector itself: a circle through a function-level import counts.
        self.assertEqual(circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}),
                         [["a", "b", "c", "a"]])
        with tempfile.TemporaryDirectory() as d:
            a, b = os.path.join(d, "a.py"), os.path.join(d, "b.py")
            with open(a, "w") as f:
                f.write("from . import b\n")
            with open(b, "w") as f:
                f.write("def f():\n    from .a import g\n")
            known = {"p.a": a, "p.b": b}
            graph = {n: imported(n, p, known) for n, p in known.items()}
        self.assertEqual(graph, {"p.a": {"p.b"}, "p.b": {"p.a"}})
        self.assertEqual(circles(graph), [["p.a", "p.b", "p.a"]])


if __name__ == "__main__":
    unittest_main.main()
