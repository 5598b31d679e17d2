"""Dataset yamls from strangers: parsed with bounded work and memory.

`yaml.safe_load` runs no code, but it does follow aliases: an "alias bomb" (a billion laughs: nine
anchors of nine aliases each) is a few hundred bytes that stand for 10^9 values. PyYAML builds
it cheaply (an alias is the same object again), and the first thing that walks it (str() of a
class name) runs out of memory after seconds. Here the document is composed into its node graph
first (linear in its text: an alias is one more reference to a node), the number of values it
stands for is counted over that graph (each node once, its size remembered), and a document that
stands for more than MAX_VALUES, nests deeper than Python's recursion allows, or whose text is
larger than MAX_BYTES is one DataError line. Only then are Python objects built. Aliases within
those limits (a shared block reused twice) still work.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..errors import DataError

MAX_VALUES = 100_000   # a dataset yaml names its splits and classes: thousands of values at most
MAX_BYTES = 16 << 20   # 16 MB of yaml text


def load_yaml(text: str, where: Any) -> Any:
    """`yaml.safe_load(text)` within the limits above; `where` names the file in a refusal. A
    document that is not yaml raises yaml.YAMLError, as safe_load does."""
    if len(text) > MAX_BYTES:
        raise DataError(f"dataset yaml {where} is {len(text) / 2**20:.0f} MB: more than the "
                        f"{MAX_BYTES >> 20} MB a dataset yaml may be")
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _count(node, {}, set())
        except RecursionError:
            raise DataError(f"dataset yaml {where} nests too deeply to be a dataset yaml") from None
        except _Unbounded as exc:
            raise DataError(f"dataset yaml {where}: {exc}") from None
        return loader.construct_document(node)
    finally:
        loader.dispose()


class _Unbounded(ValueError):
    """The document stands for more than a dataset yaml can hold."""


def _count(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values `node` stands for once every alias is expanded; a DataError past MAX_VALUES."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:  # an anchor inside itself: `&a [*a]` stands for an endless list
        raise _Unbounded("a yaml alias refers to the block that contains it (an endless document)")
    open_.add(key)
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_count(child, sizes, open_) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_count(k, sizes, open_) + _count(v, sizes, open_) for k, v in node.value)
    open_.discard(key)
    if total > MAX_VALUES:
        raise _Unbounded(f"its aliases expand to more than {MAX_VALUES} values (an alias bomb?): not a "
                         f"dataset yaml")
    sizes[key] = total
    return total
