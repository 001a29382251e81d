"""tfmot's ``ModelTransformer`` (graph_transformations/model_transformer.py) on a Keras
config's layer dicts: patterns, matching (a pattern's non-head layers have exactly one
consumer; each layer matched as a head once per transform), replacement, and the naming
of the layers a replacement creates. The transforms and tfmot's quantize configs that
drive it are in :mod:`tfgrad.qat._rewrite`."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any


class _Pattern:
    def __init__(self, class_name: str, config: dict[str, Any] | None = None,
                 inputs: list[_Pattern] | None = None) -> None:
        self.class_name = class_name
        self.config = config or {}
        self.inputs = inputs or []


class _Node:
    """transforms.LayerNode without weights (a deep copy carries the same weights, and
    the layers a transform creates differ in their config anyway)."""

    def __init__(self, layer: dict[str, Any], input_layers: list[_Node] | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        self.layer = layer
        self.input_layers = input_layers or []
        self.metadata = metadata if metadata is not None else {}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Node):
            return False
        if self.layer != other.layer or self.metadata != other.metadata:
            return False
        if len(self.input_layers) != len(other.input_layers):
            return False
        return all(a == b for a, b in zip(self.input_layers, other.input_layers))

    __hash__ = None  # type: ignore[assignment]


def _name(layer: Mapping[str, Any]) -> str:
    return str(layer["config"]["name"])


def _inbound_nodes(layer: Mapping[str, Any]) -> Iterator[Any]:
    """ModelTransformer._inbound_node_generator."""
    for node in layer.get("inbound_nodes", []):
        if isinstance(node, list) and node and isinstance(node[0], str):
            yield [node]
        else:
            yield node


def _inbound_names(layer: Mapping[str, Any]) -> list[str]:
    """ModelTransformer._get_inbound_layer_names: call inputs, then tensors in kwargs."""
    names: list[str] = []
    for node in _inbound_nodes(layer):
        if isinstance(node, dict):
            node = node.values()
        for info in node:
            names.append(info[0])
            kwargs = info[3] if len(info) > 3 else {}
            names += [v[0] for v in kwargs.values() if isinstance(v, list)]
    return names


class _Namer:
    """Keras' zero-based name counters, as fresh in a new process, skipping names the
    model has (see the module docstring)."""

    def __init__(self, taken: Callable[[], set[str]]) -> None:
        self._count: dict[str, int] = {}
        self._taken = taken
        self._given: set[str] = set()

    def __call__(self, prefix: str) -> str:
        avoid = self._taken() | self._given
        while True:
            n = self._count.get(prefix, 0)
            self._count[prefix] = n + 1
            name = f"{prefix}_{n}" if n else prefix
            if name not in avoid:
                self._given.add(name)
                return name


class _Transformer:
    """graph_transformations/model_transformer.py, on the config's layer dicts."""

    def __init__(self, layers: list[dict[str, Any]], outputs: list[list[Any]],
                 functional: bool, metadata: dict[str, dict[str, Any]],
                 candidates: set[str]) -> None:
        self.layers = layers
        self.outputs = outputs
        self.functional = functional
        self.metadata = metadata
        self.candidates = candidates
        self.matched: dict[str, list[str]] = {}
        self.namer = _Namer(lambda: {_name(x) for x in self.layers})
        # weight name in the rewritten model -> its name in the float model, for the
        # layers tfmot creates (the SeparableConv2D split)
        self.sources: dict[str, str] = {}

    # connections
    def _consumers(self, layer: Mapping[str, Any]) -> list[dict[str, Any]]:
        name = _name(layer)
        return [x for x in self.layers if name in _inbound_names(x)]

    def _output_consumers(self, layer: Mapping[str, Any]) -> list[list[Any]]:
        return [o for o in self.outputs if o[0] == _name(layer)]

    def _get_layers(self, names: list[str]) -> list[dict[str, Any]]:
        # In the config's order, not the order asked: this is where a Concatenate's
        # inputs lose their call order.
        return [x for x in self.layers if _name(x) in names]

    # matching
    def _match_layer(self, layer: Mapping[str, Any], pattern: _Pattern) -> bool:
        if self.candidates and _name(layer) not in self.candidates:
            return False
        if re.match("^" + pattern.class_name + "$", layer["class_name"]) is None:
            return False
        cfg = layer["config"]
        for key, value in pattern.config.items():
            if not (re.match("^" + str(value) + "$", str(cfg.get(key))) is not None
                    or cfg.get(key) == value):
                return False
        return True

    def _match_supported(self, layer: Mapping[str, Any], head: bool) -> bool:
        if len(layer.get("inbound_nodes", [])) > 1:
            return False
        n = len(self._consumers(layer)) + len(self._output_consumers(layer))
        return not (n > 1 and not head)

    def _input_names(self, layer: dict[str, Any]) -> list[str]:
        if self.functional:
            return [info[0] for info in layer["inbound_nodes"][0]]
        i = self.layers.index(layer)
        return [] if i == 0 else [_name(self.layers[i - 1])]

    def _match(self, layer: dict[str, Any], pattern: _Pattern, head: bool) -> _Node | None:
        if not self._match_layer(layer, pattern):
            return None
        if self.functional and not self._match_supported(layer, head):
            return None
        meta = self.metadata.get(_name(layer), {})
        if not pattern.inputs:
            return _Node(layer, [], meta)
        inputs = self._get_layers(self._input_names(layer))
        if len(inputs) != len(pattern.inputs):
            return None
        nodes = []
        for x, p in zip(inputs, pattern.inputs):
            m = self._match(x, p, False)
            if m is None:
                return None
            nodes.append(m)
        return _Node(layer, nodes, meta)

    def _find(self, pattern: _Pattern, matched: list[str]) -> _Node | None:
        for layer in self.layers:
            if matched and _name(layer) in matched:
                continue
            m = self._match(layer, pattern, True)
            if m is not None:
                return m
        return None

    # replacing
    def _leaves(self, node: _Node) -> list[dict[str, Any]]:
        if not node.input_layers:
            return [node.layer]
        out: list[dict[str, Any]] = []
        for x in node.input_layers:
            out += self._leaves(x)
        return out

    def _names(self, node: _Node) -> list[str]:
        out = [_name(node.layer)]
        for x in node.input_layers:
            out += self._names(x)
        return out

    def _remove(self, names: list[str]) -> None:
        for layer in self._get_layers(names):
            self.layers.remove(layer)
        for n in names:
            self.metadata.pop(n, None)

    def _register(self, node: _Node) -> None:
        if node.metadata:
            self.metadata[_name(node.layer)] = node.metadata
        if self.candidates:
            self.candidates.add(_name(node.layer))

    def _replace_functional(self, match: _Node, repl: _Node) -> None:
        old, new = _name(match.layer), _name(repl.layer)
        for consumer in self._consumers(match.layer):
            for node in _inbound_nodes(consumer):
                if isinstance(node, dict):
                    node = node.values()
                for info in node:
                    if info[0] == old:
                        info[0] = new
                    for value in (info[3] if len(info) > 3 else {}).values():
                        if isinstance(value, list) and value[0] == old:
                            value[0] = new
        for out in self._output_consumers(match.layer):
            out[0] = new

        def assign(node: _Node) -> None:
            # tfmot rewrites every non-leaf replacement layer's inputs as
            # [[name, 0, 0, {}], ...] in its pattern order (the config's order).
            if not node.input_layers:
                return
            node.layer["inbound_nodes"] = [[]]
            for x in node.input_layers:
                node.layer["inbound_nodes"][0].append([_name(x.layer), 0, 0, {}])
                assign(x)

        assign(repl)
        before = [x.get("inbound_nodes", []) for x in self._leaves(match)]
        after = self._leaves(repl)
        if len(before) != len(after):
            raise RuntimeError("Different size of leaf layers not supported yet.")
        for nodes, leaf in zip(before, after):
            leaf["inbound_nodes"] = nodes
        self._remove(self._names(match))

        def add(node: _Node) -> None:
            self.layers.append(node.layer)
            self._register(node)
            for x in node.input_layers:
                add(x)

        add(repl)

    def _replace_sequential(self, match: _Node, repl: _Node) -> None:
        names = self._names(match)
        i = self.layers.index(self._get_layers(names)[0])
        self._remove(names)

        def chain(node: _Node) -> list[_Node]:
            out: list[_Node] = []
            for x in node.input_layers:
                out += chain(x)
            return out + [node]

        for node in chain(repl):
            self.layers.insert(i, node.layer)
            self._register(node)
            i += 1

    def transform(self, transforms: list[_Transform]) -> None:
        while True:
            found = False
            for t in transforms:
                while True:
                    match = self._find(t.pattern(), self.matched.get(t.key, []))
                    if match is None:
                        break
                    self.matched.setdefault(t.key, []).append(_name(match.layer))
                    repl = t.replacement(copy.deepcopy(match), self)
                    if match == repl:
                        continue
                    found = True
                    if self.functional:
                        self._replace_functional(match, repl)
                    else:
                        self._replace_sequential(match, repl)
            if not found:
                return


class _Transform:
    key = ""

    def pattern(self) -> _Pattern:
        raise NotImplementedError

    def replacement(self, match: _Node, tr: _Transformer) -> _Node:
        raise NotImplementedError


def _graph_order(layers: list[dict[str, Any]], inputs: list[str], outputs: list[str]
                 ) -> list[dict[str, Any]]:
    """tf_keras' functional._map_graph_network: a depth-first walk from the outputs gives
    each layer a depth (longest path to an output) and a first-visit index; layers by
    decreasing depth, ties by index. Layers no output needs are dropped, as Keras does."""
    by_name = {_name(x): x for x in layers}

    def parents(name: str) -> list[str]:
        return [info[0] for node in by_name[name].get("inbound_nodes", []) for info in node]

    index: dict[str, int] = {}
    finished: set[str] = set()
    post: list[str] = []  # nodes_in_decreasing_depth
    for out in outputs:
        # iterative form of _build_map_helper (index on entry, append on exit)
        stack: list[tuple[str, int]] = [(out, 0)]
        while stack:
            name, i = stack.pop()
            if i == 0:
                if name in finished:
                    continue
                index.setdefault(name, len(index))
            ps = parents(name)
            if i < len(ps):
                stack.append((name, i + 1))
                if ps[i] not in finished:
                    stack.append((ps[i], 0))
            else:
                if name not in finished:
                    finished.add(name)
                    post.append(name)
    node_depth: dict[str, int] = {}
    layer_depth: dict[str, int] = {}
    for name in reversed(post):
        d = node_depth.setdefault(name, 0)
        d = max(d, layer_depth.get(name, 0))
        layer_depth[name] = d
        node_depth[name] = d
        for p in parents(name):
            node_depth[p] = max(d + 1, node_depth.get(p, 0))
    for name in inputs:
        if name not in layer_depth:
            layer_depth[name] = 0
            index[name] = -1
    ordered = sorted(layer_depth, key=lambda n: (-layer_depth[n], index[n]))
    return [by_name[n] for n in ordered]
