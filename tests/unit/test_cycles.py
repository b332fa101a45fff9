"""graph.cycles: one named cycle per strongly connected component, without recursion."""

from __future__ import annotations

import pytest

from ledgerflow import CycleError, task
from ledgerflow.graph import Graph, Node, cycles


@task
def one() -> int:
    return 1


def test_each_component_gives_its_shortest_cycle_from_its_smallest_node() -> None:
    graph = {"a": ["b"], "b": ["c", "a"], "c": ["a"], "d": ["d"], "e": ["a"], "f": []}
    assert cycles(graph) == [["a", "b", "a"], ["d", "d"]]
    assert cycles({"x": ["y"], "y": []}) == []


def test_a_chain_of_20000_steps_closed_into_a_ring_is_found() -> None:
    n = 20_000
    ring = {f"s{i:05d}": [f"s{(i + 1) % n:05d}"] for i in range(n)}
    (found,) = cycles(ring)
    assert len(found) == n + 1 and found[0] == found[-1] == "s00000"
    assert found[1] == "s00001"              # each waits for the next


def test_graph_validate_names_the_cycle_it_finds() -> None:
    g = Graph("g", may_cycle=True)
    for key, up in (("a", "c"), ("b", "a"), ("c", "b")):
        g.nodes[key] = Node(key, one, False, (), {}, (), (up,))
    with pytest.raises(CycleError) as info:
        g.validate()
    assert info.value.cycle == ["a", "c", "b", "a"]
    assert "a -> c -> b -> a" in str(info.value)
