"""taskmesh's modules import one another without a circle.

The graph is grimp's: every ``import`` of the package's modules, those inside functions
included (a function-level import hides a circle from Python's start, not from the design),
and without the ``if TYPE_CHECKING:`` blocks, which never run.
"""

from __future__ import annotations

import grimp


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """One shortest circle per strongly connected group of modules, each as ``[a, b, ..., a]``.

    :param graph: the import graph to search.
    :returns: the circles, sorted; empty when the graph has none.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[set[str]] = []
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}

    for root in sorted(edges):
        if root in index:
            continue
        # Tarjan's algorithm, iterative: a package of 150 modules may nest deeper than the recursion limit likes.
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                child = edges[node][i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                group: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1 or node in edges[node]:
                    groups.append(group)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])

    cycles = []
    for group in groups:
        shortest: list[str] | None = None
        for a in sorted(group):
            for b in edges[a]:
                if b not in group:
                    continue
                chain = [a] if a == b else graph.find_shortest_chain(importer=b, imported=a)
                if chain is not None and (shortest is None or len(chain) + 1 < len(shortest)):
                    shortest = [a, *chain] if a != b else [a, a]
        assert shortest is not None
        cycles.append(shortest)
    return sorted(cycles)


def test_no_module_of_taskmesh_imports_itself_through_others() -> None:
    graph = grimp.build_graph("taskmesh", exclude_type_checking_imports=True, cache_dir=None)
    cycles = import_cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_search_names_a_circle_and_only_once() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c", "p.d"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    graph.add_import(importer="p.c", imported="p.d")
    assert import_cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    graph.remove_import(importer="p.c", imported="p.a")
    assert import_cycles(graph) == []
