"""A traced custom loss, as the SDK's ``create_custom_loss`` uploads it, rebuilt from rlflow's own list of operations.

The SDK traces a per-datum loss ``fn(logprobs, *inputs) -> (loss, {"custom/<name>:sum|mean": tensor})`` with
torch.fx and sends its graph as plain data (``tinker.types.CustomLossGraph``): nodes naming functions by their
qualified names, methods and attributes by name, arguments as JSON. Nothing in it runs as it came:
``parse_graph`` maps every name to an entry of the tables below (elementwise math, reductions, indexing and
shape operations that allocate at most the size of their inputs) and refuses anything else, so a graph cannot
reach the file system, the network, Python's builtins or factories that allocate memory of a size it picks.
``GraphLoss.run`` then evaluates the nodes in order.

Not covered: rank-2 inputs (the wire carries one value per position), ``call_module`` and ``get_attr`` nodes (the
SDK refuses them too), and in-place methods.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch.fx.node import _get_qualified_name  # the SDK names call_function targets with it

from rlflow.service.losses import LossInputError

MAX_NODES = 1024
MAX_ARG_ITEMS = 256  # items of one list or tuple argument (a cat or stack of more would be of a size the graph picks)
MAX_PYTHON_INT, MAX_INT_POWER = 2**31, 64  # bounds on what Python computes itself (``_check_python_values``)
_SEQUENCE_OPERATORS = frozenset({"operator.add", "operator.mul", "operator.pow"})
_TENSOR_FUNCTIONS = (
    "abs", "neg", "sign", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "square", "pow",
    "sigmoid", "tanh", "relu", "clamp", "clip", "clamp_min", "clamp_max", "minimum", "maximum", "min", "max", "where",
    "sum", "mean", "prod", "std", "var", "amax", "amin", "logsumexp", "cumsum", "softmax", "log_softmax", "isfinite",
    "isnan", "nan_to_num", "lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not", "add", "sub",
    "mul", "div", "masked_fill", "gather", "numel", "detach", "zeros_like", "ones_like", "full_like", "stack", "cat",
    "unsqueeze", "squeeze", "flatten", "transpose", "reshape", "count_nonzero",
)
_FUNCTIONAL = ("logsigmoid", "softplus", "relu", "silu", "log_softmax", "softmax", "mse_loss", "l1_loss", "smooth_l1_loss")
_MATH = ("log", "log1p", "exp", "expm1", "sqrt", "fabs")
_OPERATORS = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "getitem", "lt", "le", "gt",
              "ge", "eq", "ne", "and_", "or_", "xor", "invert")
_METHODS_BESIDES = ("float", "double", "to", "type_as", "size", "dim", "view", "expand_as", "t", "contiguous",
                    "clone", "bool", "long", "int")
_ATTRIBUTES = frozenset({"shape", "dtype", "ndim", "device", "T"})
_CONSTANTS = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}


class CustomLossError(LossInputError):
    """A custom loss graph holds something the service does not run, or failed on a datum."""


def _function_table() -> dict[str, Callable[..., Any]]:
    functions = [getattr(torch, name) for name in _TENSOR_FUNCTIONS if hasattr(torch, name)]
    functions += [getattr(F, name) for name in _FUNCTIONAL] + [getattr(math, name) for name in _MATH]
    table = {_get_qualified_name(fn): fn for fn in functions}
    table.update({f"torch.nn.functional.{name}": getattr(F, name) for name in _FUNCTIONAL})
    table.update({f"operator.{name}": getattr(operator, name) for name in _OPERATORS})
    table["getattr"] = _read_attribute
    return table


def _read_attribute(value: Any, name: str) -> Any:
    if not isinstance(value, torch.Tensor) or name not in _ATTRIBUTES:
        raise CustomLossError(f"only the attributes {sorted(_ATTRIBUTES)} of a tensor may be read, not {name!r}")
    return getattr(value, name)


FUNCTIONS = _function_table()
METHODS = frozenset(name for name in (*_TENSOR_FUNCTIONS, *_METHODS_BESIDES) if hasattr(torch.Tensor, name))


@dataclass(frozen=True)
class Node:
    """One decoded node: its op, name, target (a table key, a method or parameter name) and arguments."""

    op: str
    name: str
    target: str
    args: tuple
    kwargs: Mapping[str, Any]


@dataclass(frozen=True)
class Ref:
    """A reference to an earlier node's value."""

    name: str


@dataclass(frozen=True)
class GraphLoss:
    """A checked custom loss: ``name``, its inputs (``logprobs`` first) with their ranks, and its nodes."""

    name: str
    inputs: tuple[tuple[str, int], ...]
    nodes: tuple[Node, ...]

    def run(self, values: Sequence[torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Evaluate the loss on one datum's ``values`` (one per input, in order): ``(scalar loss, metrics)``."""
        env: dict[str, Any] = {}
        placeholders = iter(values)
        for node in self.nodes:
            try:
                if node.op == "placeholder":
                    env[node.name] = next(placeholders)
                    continue
                args, kwargs = _resolve(node.args, env), _resolve(node.kwargs, env)
                if node.op == "output":
                    return _loss_and_metrics(self.name, args[0])
                env[node.name] = _call(node, args, kwargs)
            except CustomLossError:
                raise
            except Exception as error:  # noqa: BLE001 - a user's loss failing is the user's error, named by its node
                raise CustomLossError(f"custom loss {self.name!r} failed at node {node.name!r} ({node.target}): "
                                      f"{type(error).__name__}: {error}") from None
        raise CustomLossError(f"custom loss {self.name!r} has no output node")


def _check_python_values(node: Node, args: tuple) -> None:
    """Bound what Python itself computes (an operator on plain numbers or sequences), which the table cannot: a
    power or a repeated sequence of any size would hold the server's thread or memory."""
    for value in args:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_PYTHON_INT:
            raise CustomLossError(f"node {node.name!r} ({node.target}): Python integers beyond 2**31 are not allowed")
    if node.target in _SEQUENCE_OPERATORS and any(isinstance(value, (str, list, tuple)) for value in args):
        raise CustomLossError(f"node {node.name!r} ({node.target}): operators on Python sequences are not allowed")
    if node.target == "operator.pow" and all(isinstance(value, int) for value in args) and args[1] > MAX_INT_POWER:
        raise CustomLossError(f"node {node.name!r}: an integer power above {MAX_INT_POWER} is not allowed")


def _call(node: Node, args: tuple, kwargs: dict) -> Any:
    if node.op == "call_function":
        if node.target.startswith(("operator.", "math.")):
            _check_python_values(node, args)
        return FUNCTIONS[node.target](*args, **kwargs)
    receiver, *rest = args
    if not isinstance(receiver, torch.Tensor):
        raise CustomLossError(f"method {node.target!r} is called on a {type(receiver).__name__}, not a tensor")
    return getattr(receiver, node.target)(*rest, **kwargs)


def _resolve(value: Any, env: Mapping[str, Any]) -> Any:
    if isinstance(value, Ref):
        return env[value.name]
    if isinstance(value, tuple):
        return tuple(_resolve(item, env) for item in value)
    if isinstance(value, list):
        return [_resolve(item, env) for item in value]
    if isinstance(value, slice):
        return slice(*(_resolve(part, env) for part in (value.start, value.stop, value.step)))
    if isinstance(value, dict):
        return {key: _resolve(item, env) for key, item in value.items()}
    return value


def _loss_and_metrics(name: str, output: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    if not (isinstance(output, (tuple, list)) and len(output) == 2 and isinstance(output[1], dict)):
        raise CustomLossError(f"custom loss {name!r} must return (loss, metrics)")
    loss, metrics = output
    for key, value in {"loss": loss, **metrics}.items():
        if not (isinstance(value, torch.Tensor) and value.ndim == 0):
            raise CustomLossError(f"custom loss {name!r}: {key} must be a scalar tensor, got {getattr(value, 'shape', value)}")
    return loss, dict(metrics)


# ---------------------------------------------------------------- decoding the SDK's plain data
def _decode(value: Any, known: set[str]) -> Any:
    """One encoded argument (``tinker.types.CustomLossNode.args``) as a Python value, ``Ref`` for a node."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list) or (isinstance(value, dict) and isinstance(value.get("tuple"), list)):
        items = value if isinstance(value, list) else value["tuple"]
        if len(items) > MAX_ARG_ITEMS:
            raise CustomLossError(f"an argument holds {len(items)} items; at most {MAX_ARG_ITEMS}")
    if isinstance(value, list):
        return [_decode(item, known) for item in value]
    if not (isinstance(value, dict) and len(value) == 1):
        raise CustomLossError(f"argument {value!r} is not one of the SDK's encodings")
    (kind, payload), = value.items()
    if kind == "ref":
        if payload not in known:
            raise CustomLossError(f"argument refers to {payload!r}, which no earlier node defines")
        return Ref(payload)
    if kind in _CONSTANTS:
        constant = getattr(torch, str(payload), None)
        if not isinstance(constant, _CONSTANTS[kind]):
            raise CustomLossError(f"{payload!r} is not a torch {kind}")
        return constant
    if kind == "float" and payload not in ("inf", "-inf", "nan"):
        raise CustomLossError(f"{payload!r} is not inf, -inf or nan")
    decoders = {
        "tuple": lambda: tuple(_decode(item, known) for item in payload),
        "dict": lambda: {str(key): _decode(item, known) for key, item in payload.items()},
        "slice": lambda: slice(*(_decode(part, known) for part in payload)),
        "ellipsis": lambda: Ellipsis,
        "float": lambda: float(payload),
        "device": lambda: torch.device(payload),
    }
    if kind not in decoders:
        raise CustomLossError(f"argument encoding {kind!r} is not one of the SDK's")
    return decoders[kind]()


def _check_target(op: str, target: str) -> None:
    allowed = {"call_function": FUNCTIONS, "call_method": METHODS}.get(op)
    if allowed is None:
        if op not in ("placeholder", "output"):
            raise CustomLossError(f"unsupported: {op} nodes (a custom loss reads only its inputs and calls functions)")
        return
    if target not in allowed:
        kind = "function" if op == "call_function" else "tensor method"
        raise CustomLossError(f"unsupported: {kind} {target!r} (a custom loss may call the service's elementwise, "
                              "reduction, indexing and shape operations of torch, math and operator; docs/service.md)")


def parse_graph(name: str, inputs: Sequence[tuple[str, int]], graph: Mapping[str, Any]) -> GraphLoss:
    """Check and decode ``graph`` (a ``CustomLossGraph`` as JSON) of the loss ``name`` with ``inputs``
    (``(name, rank)``, ``logprobs`` first); ``CustomLossError`` says what it refuses."""
    if graph.get("format") != 1:
        raise CustomLossError(f"custom loss graph format {graph.get('format')!r} is not 1")
    raw_nodes = graph.get("nodes")
    if not isinstance(raw_nodes, list) or not 0 < len(raw_nodes) <= MAX_NODES:
        raise CustomLossError(f"a custom loss graph holds 1 to {MAX_NODES} nodes")
    nodes, known = [], set()
    for raw in raw_nodes:
        if not isinstance(raw, dict) or not all(isinstance(raw.get(key), str) for key in ("op", "name", "target")):
            raise CustomLossError(f"node {raw!r} lacks an op, name or target")
        _check_target(raw["op"], raw["target"])
        try:
            node = Node(raw["op"], raw["name"], raw["target"], tuple(_decode(arg, known) for arg in raw.get("args", [])),
                        {str(key): _decode(arg, known) for key, arg in (raw.get("kwargs") or {}).items()})
        except CustomLossError:
            raise
        except (TypeError, ValueError, RuntimeError, AttributeError) as error:
            raise CustomLossError(f"node {raw['name']!r}: malformed arguments ({error})") from None
        known.add(node.name)
        nodes.append(node)
    parameters = [node.target for node in nodes if node.op == "placeholder"]
    if parameters != [input_name for input_name, _ in inputs]:
        raise CustomLossError(f"the graph's parameters {parameters} are not the declared inputs {[n for n, _ in inputs]}")
    if [node.op for node in nodes].count("output") != 1 or nodes[-1].op != "output":
        raise CustomLossError("a custom loss graph ends with its one output node")
    return GraphLoss(name, tuple(inputs), tuple(nodes))


__all__ = ["CustomLossError", "FUNCTIONS", "GraphLoss", "MAX_NODES", "METHODS", "parse_graph"]
